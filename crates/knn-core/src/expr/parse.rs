//! Lexer and recursive-descent parser of expression metrics, building folded, shared programs.
//!
//! Grammar (`^` binds tighter than unary minus, which binds tighter than `*` and `/`):
//! ```text
//! text   := expr [ ';' expr ]
//! expr   := term { ('+' | '-') term }
//! term   := unary { ('*' | '/') unary }
//! unary  := '-' unary | power
//! power  := atom [ '^' WHOLE_NUMBER ]
//! atom   := NUMBER | NAME | NAME '(' expr { ',' expr } ')' | '(' expr ')'
//! ```

use super::{ExprError, Func, Node, Op, Program, Span, MAX_NODES};
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Num(f64),
    Name(String),
    Sym(char),
    End,
}

fn lex(text: &str) -> Result<Vec<(Tok, Span)>, ExprError> {
    let chars: Vec<char> = text.chars().collect();
    let span = |start: usize, end: usize| Span {
        start: start as u32,
        len: (end - start) as u32,
    };
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let start = i;
        if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            while i < chars.len() && (chars[i].is_ascii_digit() || chars[i] == '.') {
                i += 1;
            }
            if i < chars.len() && (chars[i] == 'e' || chars[i] == 'E') {
                // An exponent; a malformed one ('1e', '2e+') stays in the token and fails below.
                i += 1;
                if i < chars.len() && (chars[i] == '+' || chars[i] == '-') {
                    i += 1;
                }
                while i < chars.len() && chars[i].is_ascii_digit() {
                    i += 1;
                }
            }
            let s: String = chars[start..i].iter().collect();
            match s.parse::<f64>() {
                Ok(v) if v.is_finite() => toks.push((Tok::Num(v), span(start, i))),
                _ => {
                    return Err(ExprError::at(
                        text,
                        span(start, i),
                        format!("'{s}' is not a number"),
                    ))
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            toks.push((Tok::Name(chars[start..i].iter().collect()), span(start, i)));
        } else if "+-*/^(),;".contains(c) {
            i += 1;
            toks.push((Tok::Sym(c), span(start, i)));
        } else {
            return Err(ExprError::at(
                text,
                span(start, start + 1),
                format!("unexpected character '{c}'"),
            ));
        }
    }
    toks.push((Tok::End, span(chars.len(), chars.len())));
    Ok(toks)
}

/// Builds a program: identical nodes are shared, operations on constants folded.
struct Builder<'t> {
    text: &'t str,
    nodes: Vec<Node>,
    index: HashMap<(u8, u64, u32, u32), u32>,
}

impl<'t> Builder<'t> {
    fn new(text: &'t str) -> Self {
        Builder {
            text,
            nodes: Vec::new(),
            index: HashMap::new(),
        }
    }

    fn push(&mut self, op: Op, at: Span) -> Result<u32, ExprError> {
        let key = match op {
            Op::Acc => (0, 0, 0, 0),
            Op::X => (1, 0, 0, 0),
            Op::Y => (2, 0, 0, 0),
            Op::Const(c) => (3, c.to_bits(), 0, 0),
            Op::Apply(f, a, b) => (4, f as u64, a, b),
        };
        if let Some(&i) = self.index.get(&key) {
            return Ok(i);
        }
        if self.nodes.len() >= 4 * MAX_NODES {
            return Err(self.too_long(at));
        }
        let i = self.nodes.len() as u32;
        self.nodes.push(Node { op, at });
        self.index.insert(key, i);
        Ok(i)
    }

    fn too_long(&self, at: Span) -> ExprError {
        ExprError::at(
            self.text,
            at,
            format!("the expression is too long (more than {MAX_NODES} operations)"),
        )
    }

    fn constant(&self, i: u32) -> Option<f64> {
        match self.nodes[i as usize].op {
            Op::Const(c) => Some(c),
            _ => None,
        }
    }

    fn apply(&mut self, f: Func, a: u32, b: u32, at: Span) -> Result<u32, ExprError> {
        let b = if f.is_unary() { a } else { b };
        if let (Some(x), Some(y)) = (self.constant(a), self.constant(b)) {
            let v = f.f64(x, y);
            if !v.is_finite() {
                let what = if f.is_unary() {
                    format!("{}({x})", f.name())
                } else {
                    format!("{x} {} {y}", f.name())
                };
                return Err(ExprError::at(
                    self.text,
                    at,
                    format!("{what} is {v}, not a finite number"),
                ));
            }
            return self.push(Op::Const(if v == 0.0 { 0.0 } else { v }), at);
        }
        self.push(Op::Apply(f, a, b), at)
    }

    /// The program of the nodes reachable from `root`, in order.
    fn finish(self, root: u32, whole: Span) -> Result<Program, ExprError> {
        let mut used = vec![false; self.nodes.len()];
        used[root as usize] = true;
        for i in (0..=root as usize).rev() {
            if used[i] {
                if let Op::Apply(_, a, b) = self.nodes[i].op {
                    used[a as usize] = true;
                    used[b as usize] = true;
                }
            }
        }
        let mut remap = vec![u32::MAX; self.nodes.len()];
        let mut nodes = Vec::new();
        for i in 0..=root as usize {
            if !used[i] {
                continue;
            }
            let mut n = self.nodes[i];
            if let Op::Apply(f, a, b) = n.op {
                n.op = Op::Apply(f, remap[a as usize], remap[b as usize]);
            }
            remap[i] = nodes.len() as u32;
            nodes.push(n);
        }
        if nodes.len() > MAX_NODES {
            return Err(self.too_long(whole));
        }
        Ok(Program { nodes, whole })
    }
}

/// Which part is being parsed: the variables differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Accumulation,
    Final,
}

struct Parser<'t> {
    text: &'t str,
    toks: Vec<(Tok, Span)>,
    pos: usize,
    b: Builder<'t>,
    part: Part,
}

const FUNCTIONS: &str = "abs, sqrt, exp, log, min, max";

impl<'t> Parser<'t> {
    fn peek(&self) -> &(Tok, Span) {
        &self.toks[self.pos]
    }

    fn sym(&self, c: char) -> bool {
        self.peek().0 == Tok::Sym(c)
    }

    fn err(&self, at: Span, msg: impl Into<String>) -> ExprError {
        ExprError::at(self.text, at, msg)
    }

    fn expr(&mut self) -> Result<u32, ExprError> {
        let mut t = self.term()?;
        loop {
            let (f, at) = match self.peek() {
                (Tok::Sym('+'), at) => (Func::Add, *at),
                (Tok::Sym('-'), at) => (Func::Sub, *at),
                _ => return Ok(t),
            };
            self.pos += 1;
            let r = self.term()?;
            t = self.b.apply(f, t, r, at)?;
        }
    }

    fn term(&mut self) -> Result<u32, ExprError> {
        let mut t = self.unary()?;
        loop {
            let (f, at) = match self.peek() {
                (Tok::Sym('*'), at) => (Func::Mul, *at),
                (Tok::Sym('/'), at) => (Func::Div, *at),
                _ => return Ok(t),
            };
            self.pos += 1;
            let r = self.unary()?;
            t = self.b.apply(f, t, r, at)?;
        }
    }

    fn unary(&mut self) -> Result<u32, ExprError> {
        if self.sym('-') {
            let at = self.peek().1;
            self.pos += 1;
            let u = self.unary()?;
            return self.b.apply(Func::Neg, u, u, at);
        }
        self.power()
    }

    fn power(&mut self) -> Result<u32, ExprError> {
        let a = self.atom()?;
        if !self.sym('^') {
            return Ok(a);
        }
        let at = self.peek().1;
        self.pos += 1;
        let (tok, nat) = self.peek().clone();
        let n = match tok {
            Tok::Num(v) if v.fract() == 0.0 && (0.0..=64.0).contains(&v) => v as u32,
            _ => {
                return Err(self.err(
                    nat,
                    "the exponent must be a whole number from 0 to 64 (use sqrt, or exp(p * log(a)) for other powers)",
                ))
            }
        };
        self.pos += 1;
        if self.sym('^') {
            return Err(self.err(
                self.peek().1,
                "a power of a power needs parentheses: (a^m)^n",
            ));
        }
        if n == 0 {
            return self.b.push(Op::Const(1.0), at);
        }
        // Square and multiply: the same multiplications, in the same order, on every engine.
        let (mut result, mut base, mut e) = (None, a, n);
        loop {
            if e & 1 == 1 {
                result = Some(match result {
                    None => base,
                    Some(r) => self.b.apply(Func::Mul, r, base, at)?,
                });
            }
            e >>= 1;
            if e == 0 {
                break;
            }
            base = self.b.apply(Func::Mul, base, base, at)?;
        }
        Ok(result.expect("n ≥ 1"))
    }

    fn atom(&mut self) -> Result<u32, ExprError> {
        let (tok, at) = self.peek().clone();
        match tok {
            Tok::Num(v) => {
                self.pos += 1;
                self.b.push(Op::Const(v), at)
            }
            Tok::Sym('(') => {
                self.pos += 1;
                let e = self.expr()?;
                if !self.sym(')') {
                    return Err(self.err(self.peek().1, "expected ')'"));
                }
                self.pos += 1;
                Ok(e)
            }
            Tok::Name(name) => {
                self.pos += 1;
                if self.sym('(') {
                    return self.call(&name, at);
                }
                match (name.as_str(), self.part) {
                    ("acc", _) => self.b.push(Op::Acc, at),
                    ("x", Part::Accumulation) => self.b.push(Op::X, at),
                    ("y", Part::Accumulation) => self.b.push(Op::Y, at),
                    ("x" | "y", Part::Final) => Err(self.err(
                        at,
                        format!("'{name}' is not available in the final step (it sees acc only)"),
                    )),
                    (_, Part::Accumulation) => Err(self.err(
                        at,
                        format!("unknown variable '{name}' (variables: acc, x, y)"),
                    )),
                    (_, Part::Final) => Err(self.err(
                        at,
                        format!("unknown variable '{name}' (the final step sees acc only)"),
                    )),
                }
            }
            Tok::End => Err(self.err(at, "the expression ends where a value is expected")),
            Tok::Sym('*')
                if self
                    .text
                    .get(..at.start as usize)
                    .is_some_and(|t| t.trim_end().ends_with('*')) =>
            {
                Err(self.err(
                    at,
                    "'**' is not an operator here: write powers with ^ (x^2, (x - y)^3)",
                ))
            }
            Tok::Sym(c) => Err(self.err(
                at,
                format!("expected a number, a variable, a function or '(', found '{c}'"),
            )),
        }
    }

    fn call(&mut self, name: &str, at: Span) -> Result<u32, ExprError> {
        let f = match name {
            "abs" => Func::Abs,
            "sqrt" => Func::Sqrt,
            "exp" => Func::Exp,
            "log" => Func::Log,
            "min" => Func::Min,
            "max" => Func::Max,
            _ => {
                return Err(self.err(
                    at,
                    format!("unknown function '{name}' (functions: {FUNCTIONS})"),
                ))
            }
        };
        self.pos += 1; // '('
        let mut args = vec![self.expr()?];
        while self.sym(',') {
            self.pos += 1;
            args.push(self.expr()?);
        }
        if !self.sym(')') {
            return Err(self.err(self.peek().1, "expected ',' or ')'"));
        }
        self.pos += 1;
        if f.is_unary() && args.len() != 1 {
            return Err(self.err(at, format!("'{name}' takes 1 argument, not {}", args.len())));
        }
        if !f.is_unary() && args.len() < 2 {
            return Err(self.err(at, format!("'{name}' takes 2 or more arguments")));
        }
        let mut r = args[0];
        for &a in &args[1..] {
            r = self.b.apply(f, r, a, at)?;
        }
        if f.is_unary() {
            r = self.b.apply(f, r, r, at)?;
        }
        Ok(r)
    }

    /// One part, up to `;` or the end.
    fn part(&mut self, part: Part) -> Result<Program, ExprError> {
        self.part = part;
        self.b = Builder::new(self.text);
        let first = self.peek().1;
        if matches!(self.peek().0, Tok::End | Tok::Sym(';')) {
            let what = match part {
                Part::Accumulation => "the accumulation is empty (e.g. 'acc + abs(x - y)')",
                Part::Final => "the final step after ';' is empty (e.g. 'sqrt(acc)')",
            };
            return Err(self.err(first, what));
        }
        let root = self.expr()?;
        let last = self.toks[self.pos - 1].1;
        let whole = Span {
            start: first.start,
            len: last.start + last.len - first.start,
        };
        let b = std::mem::replace(&mut self.b, Builder::new(self.text));
        b.finish(root, whole)
    }
}

/// Parses `ACCUMULATION [; FINAL]` and checks which variables each part uses.
pub(super) fn parse(text: &str) -> Result<(Program, Option<Program>), ExprError> {
    let mut p = Parser {
        text,
        toks: lex(text)?,
        pos: 0,
        b: Builder::new(text),
        part: Part::Accumulation,
    };
    let acc = p.part(Part::Accumulation)?;
    let fin = if p.sym(';') {
        p.pos += 1;
        Some(p.part(Part::Final)?)
    } else {
        None
    };
    match &p.peek().0 {
        Tok::End => {}
        Tok::Sym(';') => return Err(p.err(p.peek().1, "a second ';': there is one final step")),
        Tok::Sym(')') => return Err(p.err(p.peek().1, "unmatched ')'")),
        _ => {
            return Err(p.err(
                p.peek().1,
                "expected an operator (+ - * / ^), ';' or the end",
            ))
        }
    }
    let deps = acc.deps();
    let used = deps.last().copied().unwrap_or(0);
    for (bit, what) in [
        (1u8, "acc (the running value, e.g. 'acc + abs(x - y)')"),
        (2, "x (the query's coordinate)"),
        (4, "y (the base point's coordinate)"),
    ] {
        if used & bit == 0 {
            return Err(ExprError::at(
                text,
                acc.whole,
                format!("the accumulation must use {what}"),
            ));
        }
    }
    if let Some(f) = &fin {
        if f.deps().last().copied().unwrap_or(0) & 1 == 0 {
            return Err(ExprError::at(text, f.whole, "the final step must use acc"));
        }
    }
    Ok((acc, fin))
}

/// Structural symmetry under swapping x and y (see [`super::MetricExpr::is_symmetric`]): each
/// node gets a canonical id, interned, with operands of commutative operations sorted and the
/// difference inside `abs(a − b)` and `(a − b)·(a − b)` taken as an unordered pair.
pub(super) fn is_symmetric(p: &Program) -> bool {
    let mut intern: HashMap<(u8, u64, u32, u32), u32> = HashMap::new();
    let mut id = |key: (u8, u64, u32, u32)| {
        let n = intern.len() as u32;
        *intern.entry(key).or_insert(n)
    };
    let mut canon = |swap: bool| -> u32 {
        let mut c = vec![0u32; p.nodes.len()];
        for (i, n) in p.nodes.iter().enumerate() {
            let key = match n.op {
                Op::Acc => (0, 0, 0, 0),
                Op::X => (if swap { 2 } else { 1 }, 0, 0, 0),
                Op::Y => (if swap { 1 } else { 2 }, 0, 0, 0),
                Op::Const(v) => (3, v.to_bits(), 0, 0),
                Op::Apply(f, a, b) => {
                    let (ca, cb) = (c[a as usize], c[b as usize]);
                    let sub_pair = |j: u32| match p.nodes[j as usize].op {
                        Op::Apply(Func::Sub, u, v) => {
                            let (cu, cv) = (c[u as usize], c[v as usize]);
                            Some((cu.min(cv), cu.max(cv)))
                        }
                        _ => None,
                    };
                    match f {
                        Func::Abs if sub_pair(a).is_some() => {
                            let (u, v) = sub_pair(a).expect("checked");
                            (5, 0, u, v)
                        }
                        Func::Mul if a == b && sub_pair(a).is_some() => {
                            let (u, v) = sub_pair(a).expect("checked");
                            (6, 0, u, v)
                        }
                        Func::Add | Func::Mul | Func::Min | Func::Max => {
                            (4, f as u64, ca.min(cb), ca.max(cb))
                        }
                        _ => (4, f as u64, ca, cb),
                    }
                }
            };
            c[i] = id(key);
        }
        c.last().copied().unwrap_or(0)
    };
    let plain = canon(false);
    let swapped = canon(true);
    plain == swapped
}

#[cfg(test)]
mod tests {
    use super::super::MetricExpr;

    fn err(text: &str) -> (usize, String) {
        let e = MetricExpr::parse(text).expect_err(text);
        (e.column(), e.message().to_string())
    }

    #[test]
    fn errors_name_the_column() {
        // (expression, column of the error, part of its message)
        for (text, column, part) in [
            ("acc + sqr(x - y)", 7, "unknown function 'sqr'"),
            ("acc + abs(x - z)", 15, "unknown variable 'z'"),
            ("acc + abs(x - y) ; sqrt(x)", 25, "final step"),
            ("acc + abs(x - y", 16, ""),
            ("acc + (x - y)^0.5", 15, "exponent"),
            ("acc + x # y", 9, "unexpected character '#'"),
            ("acc + abs(x, y)", 7, "1 argument"),
            ("max(acc)", 1, "2 or more"),
            ("abs(x - y)", 1, "must use acc"),
            ("acc + abs(x - y) ; 2", 20, "must use acc"),
            ("acc + abs(x - y) ; sqrt(acc) ; acc", 30, "second ';'"),
            ("acc + log(0) * x * y", 7, "not a finite number"),
            ("acc + x y", 9, ""),
            ("acc + (x - y))", 14, ""),
            ("", 1, ""),
            ("acc + abs(x - y) ;", 19, ""),
            ("acc + x^2^2 * y", 10, "parentheses"),
            ("acc + 1e * x * y", 7, ""),
            // Columns count characters, not bytes.
            ("acc + ±x", 7, ""),
        ] {
            let (c, m) = err(text);
            assert_eq!(c, column, "{text}: {m}");
            assert!(m.contains(part), "{text}: {m}");
        }
        let (_, m) = err("acc + abs(x)");
        assert!(m.contains("must use y"), "{m}");
    }

    #[test]
    fn display_has_a_caret_line() {
        let e = MetricExpr::parse("acc + sqr(x - y)").unwrap_err();
        let s = e.to_string();
        assert!(s.starts_with("column 7: unknown function 'sqr'"), "{s}");
        assert!(s.ends_with("\n    acc + sqr(x - y)\n          ^^^"), "{s}");
    }

    #[test]
    fn keys_and_distances_in_f64() {
        let l1 = MetricExpr::parse("acc + abs(x - y)").unwrap();
        assert_eq!(l1.key(&[1.0, 2.0, 3.0], &[3.0, 2.0, -1.0]), 6.0);
        let l2 = MetricExpr::parse(" acc + (x - y)^2 ; sqrt(acc) ").unwrap();
        assert_eq!(l2.key(&[0.0, 3.0], &[4.0, 0.0]), 25.0);
        assert_eq!(l2.distance(25.0), 5.0);
        let linf = MetricExpr::parse("max(acc, abs(x - y))").unwrap();
        assert_eq!(linf.key(&[0.0, 3.0, 1.0], &[1.0, -2.0, 0.0]), 5.0);
        let p = MetricExpr::parse("acc + -x^2 * 0 + 2^3 * y * x").unwrap();
        assert_eq!(p.key(&[1.0, 2.0], &[3.0, 4.0]), 8.0 * (3.0 + 8.0));
        let m = MetricExpr::parse("acc + min(x, y, 1) - max(x, y, -1)").unwrap();
        assert_eq!(m.key(&[0.5], &[2.0]), 0.5 - 2.0);
        let pow = MetricExpr::parse("acc + (x - y)^5 + (x-y)^0").unwrap();
        assert_eq!(pow.key(&[3.0], &[1.0]), 33.0);
        let e = MetricExpr::parse("acc + exp(x) * log(y)").unwrap();
        assert_eq!(e.key(&[0.0], &[1.0]), 0.0);
    }

    #[test]
    fn fold_form_keys_are_the_plain_keys() {
        let mut seed = 7u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 40) as f32 / (1u64 << 24) as f32
        };
        for text in [
            "acc + abs(x - y)",
            "max(acc, abs(x - y))",
            "abs(x - y) + acc",
            "max(-x * y, acc)",
            "acc + (sqrt(x) - sqrt(y))^2",
            "acc + exp(-abs(x - y)) * log(x + y + 1) / (min(x, y) + 1)",
            "acc + ((((x - y)^2 + 1) * (abs(x - y) + 2) + x) * y - 3 * x + 1)^2 * (x + y)",
        ] {
            let e = MetricExpr::parse(text).unwrap();
            assert!(e.fold.is_some(), "{text}");
            for d in [1usize, 31, 32, 33, 100] {
                let x: Vec<f32> = (0..d).map(|_| next()).collect();
                let y: Vec<f32> = (0..d).map(|_| next()).collect();
                assert_eq!(
                    e.key(&x, &y).to_bits(),
                    e.key_plain(&x, &y).to_bits(),
                    "{text} d={d}"
                );
                // Batched, in groups and a partial group, with repeated rows.
                let rows: Vec<f32> = (0..11 * d).map(|_| next()).collect();
                let base = crate::MatrixRef::new("b", &rows, d).unwrap();
                let ids = [3u32, 0, 10, 3, 7, 1, 2, 9, 8, 4, 5, 6];
                let mut out = Vec::new();
                e.keys(&x, base, &ids, &mut out);
                for (&(k, id), &want) in out.iter().zip(&ids) {
                    assert_eq!(id, want);
                    let plain = e.key_plain(&x, base.row(id as usize));
                    assert_eq!(k.to_bits(), plain.to_bits(), "{text} d={d} id={id}");
                }
            }
        }
        for text in [
            "0.5 * acc + abs(x - y)",
            "acc + acc * x * y",
            "max(acc, x) - y",
        ] {
            assert!(MetricExpr::parse(text).unwrap().fold.is_none(), "{text}");
        }
    }

    #[test]
    fn sharing_and_folding_keep_programs_small() {
        let p = MetricExpr::parse("acc + (sqrt(x) - sqrt(y))^2").unwrap();
        // acc, x, sqrt x, y, sqrt y, -, *, +
        assert_eq!(p.accumulation().nodes.len(), 8);
        let q = MetricExpr::parse("acc + abs(x - y) * (2 * 3 - 5)").unwrap();
        assert_eq!(q.accumulation().nodes.len(), 8);
    }

    #[test]
    fn symmetry_is_structural() {
        for s in [
            "acc + abs(x - y)",
            "acc + (sqrt(x) - sqrt(y))^2",
            "max(acc, abs(y - x))",
            "acc + x * y",
            "acc + abs(x - y) / (x + y + 1)",
            "acc + (x - y) * (x - y)",
        ] {
            assert!(MetricExpr::parse(s).unwrap().is_symmetric(), "{s}");
        }
        for s in ["acc + abs(x - 2 * y)", "acc + (x - y)", "acc + x * x * y"] {
            assert!(!MetricExpr::parse(s).unwrap().is_symmetric(), "{s}");
        }
    }
}

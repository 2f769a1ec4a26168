//! The proven bound on an expression program's rounding: intervals with directed rounding,
//! each instruction's error `|v₃₂ − v₆₄| ≤ a + r·|v₆₄|` propagated operation by operation
//! ([`apply`]), and the check that the final step is defined and non-decreasing over the keys
//! of the data ([`check_final`]). The formulas are in [`super::plan`]'s module docs.

use super::ExprError;
use super::{Func, Op, Program};

pub(super) const U32: f64 = 1.0 / (1u64 << 24) as f64;
pub(super) const U64: f64 = 1.0 / (1u64 << 53) as f64;
/// Absolute error of a rounding into the subnormal range (f32 and f64 together).
pub(super) const ETA: f64 = 1.401298464324817e-45; // 2⁻¹⁴⁹

/// The largest f32 value not above `v` (as f64).
pub(super) fn round_down(v: f64) -> f64 {
    let f = v as f32;
    (if (f as f64) > v { f.next_down() } else { f }) as f64
}

/// The smallest f32 value not below `v` (as f64).
pub(super) fn round_up(v: f64) -> f64 {
    let f = v as f32;
    (if (f as f64) < v { f.next_up() } else { f }) as f64
}

/// A closed interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Iv {
    pub(super) lo: f64,
    pub(super) hi: f64,
}

impl Iv {
    pub(super) fn point(v: f64) -> Self {
        Iv { lo: v, hi: v }
    }
    pub(super) fn of(a: f64, b: f64) -> Self {
        Iv {
            lo: a.min(b),
            hi: a.max(b),
        }
    }
    pub(super) fn maxabs(self) -> f64 {
        self.lo.abs().max(self.hi.abs())
    }
    pub(super) fn minabs(self) -> f64 {
        if self.lo <= 0.0 && self.hi >= 0.0 {
            0.0
        } else {
            self.lo.abs().min(self.hi.abs())
        }
    }
    /// The f32 values between `round_down(lo)` and `round_up(hi)`: every f32 *and* f64
    /// rounding of a real value in `[lo, hi]` lies there (rounding is monotone and f32 values are
    /// f64 values), so an engine's value and the reference's value of an operation both do.
    pub(super) fn to_f32(self) -> Self {
        Iv {
            lo: round_down(self.lo),
            hi: round_up(self.hi),
        }
    }
    /// Widened by a relative error `rel` (a function not correctly rounded), keeping the sign.
    pub(super) fn loose(self, rel: f64) -> Self {
        let lo = self.lo - self.lo.abs() * rel;
        let hi = self.hi + self.hi.abs() * rel;
        Iv {
            lo: if self.lo >= 0.0 {
                lo.max(0.0)
            } else {
                lo - 5e-324
            },
            hi: if self.hi <= 0.0 {
                hi.min(0.0)
            } else {
                hi + 5e-324
            },
        }
    }
}

/// Lower and upper bounds of the real value of `a ∘ b` (f64 operands), from the f64 result and
/// the sign of its rounding error (exact by TwoSum / FMA away from underflow): an exact result
/// stays as it is, so `3 − 3 + x ≥ 0` is seen to hold.
pub(super) fn op_bounds(f: Func, a: f64, b: f64) -> (f64, f64) {
    // Lower / upper bound from a result `r` whose error `real − r` has the sign of `err`.
    let by = |r: f64, err: f64| {
        (
            if err < 0.0 { r.next_down() } else { r },
            if err > 0.0 { r.next_up() } else { r },
        )
    };
    // Below this magnitude FMA-based errors may themselves round: widen by an ulp instead.
    const TINY: f64 = 1e-280;
    let r = f.f64(a, b);
    if !r.is_finite() {
        return (r, r);
    }
    match f {
        Func::Add | Func::Sub => {
            let b = if f == Func::Sub { -b } else { b };
            let bb = r - a;
            by(r, (a - (r - bb)) + (b - bb))
        }
        Func::Mul | Func::Div => {
            let (x, y) = (a, b);
            if r == 0.0 || r.abs() < TINY {
                if x == 0.0 || (f == Func::Mul && y == 0.0) {
                    return (0.0, 0.0);
                }
                // Underflow: the sign is known, the size is tiny.
                let neg = (x < 0.0) != (y < 0.0);
                let t = r.abs().next_up();
                return if neg { (-t, 0.0) } else { (0.0, t) };
            }
            let err = if f == Func::Mul {
                x.mul_add(y, -r)
            } else {
                // x − r·y, of the sign of (x/y − r)·y.
                let rem = (-r).mul_add(y, x);
                if y < 0.0 {
                    -rem
                } else {
                    rem
                }
            };
            by(r, err)
        }
        Func::Sqrt => {
            if r == 0.0 || r < TINY {
                return (0.0, r.next_up());
            }
            by(r, (-r).mul_add(r, a))
        }
        // libm: within 2 ulp.
        Func::Exp | Func::Log => {
            let w = r.abs() * 4.0 * U64 + 5e-324;
            (
                if f == Func::Exp {
                    (r - w).max(0.0)
                } else {
                    r - w
                },
                r + w,
            )
        }
        Func::Neg | Func::Abs | Func::Min | Func::Max => (r, r),
    }
}

/// Bounds of the real values of `a ∘ b` over operand intervals (`same`: both operands are one
/// value, so `a·a ≥ 0`). Monotone pieces are evaluated at their endpoints.
pub(super) fn real_range(f: Func, a: Iv, b: Iv, same: bool) -> Iv {
    let pairs: &[(f64, f64)] = match f {
        Func::Add => &[(a.lo, b.lo), (a.hi, b.hi)],
        Func::Sub => &[(a.lo, b.hi), (a.hi, b.lo)],
        Func::Mul if same => &[(a.minabs(), a.minabs()), (a.maxabs(), a.maxabs())],
        Func::Mul | Func::Div => &[(a.lo, b.lo), (a.lo, b.hi), (a.hi, b.lo), (a.hi, b.hi)],
        _ => &[(a.lo, a.lo), (a.hi, a.hi)],
    };
    let mut out = Iv {
        lo: f64::INFINITY,
        hi: f64::NEG_INFINITY,
    };
    for &(x, y) in pairs {
        let (lo, hi) = op_bounds(f, x, y);
        out.lo = out.lo.min(lo);
        out.hi = out.hi.max(hi);
    }
    out
}

/// An instruction's values and error: `v` holds every value it takes in f32 and in f64, and
/// `|v₃₂ − v₆₄| ≤ a + r·|v₆₄|`.
#[derive(Clone, Copy, Debug)]
pub(super) struct St {
    pub(super) v: Iv,
    pub(super) a: f64,
    pub(super) r: f64,
}

impl St {
    /// The error as an absolute bound over `v`.
    pub(super) fn abs(self) -> f64 {
        self.a + self.r * self.v.maxabs()
    }
}

pub(super) fn num(v: f64) -> String {
    if v == 0.0 || (1e-4..1e6).contains(&v.abs()) {
        let s = format!("{v:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        if s == "-0" {
            "0".into()
        } else {
            s.into()
        }
    } else {
        format!("{v:.3e}")
    }
}

pub(super) fn range(v: Iv) -> String {
    format!("[{}, {}]", num(v.lo), num(v.hi))
}

/// The error of an operation's result from its propagated error `|s₃₂ − s| ≤ pa + pr·|s|`
/// (`s₃₂`, `s`: the exact results on the f32 and the f64 operands) and one rounding of each
/// (`u32`: the f32 one, relative, `u64` the f64 one): with `v₃₂ = fl(s₃₂)`, `v₆₄ = fl(s)`,
/// `|v₃₂ − v₆₄| ≤ u32·|s₃₂| + |s₃₂ − s| + u64·|s| + 2η` and `|s| ≤ (1 + 2u64)|v₆₄| + η`.
pub(super) fn rounded(v: Iv, pa: f64, pr: f64, u32: f64, u64: f64) -> St {
    let r = (pr * (1.0 + u32) + u32 + u64) * (1.0 + 2.0 * u64);
    let a = pa * (1.0 + u32) + 3.0 * ETA;
    capped(St { v, a, r })
}

/// Both values lie in `v`, so their difference is at most its width: a bound that never grows
/// past it.
pub(super) fn capped(s: St) -> St {
    let width = s.v.hi - s.v.lo;
    if s.abs() > width {
        St {
            v: s.v,
            a: width,
            r: 0.0,
        }
    } else {
        s
    }
}

/// `true` when every value of both intervals has one sign (so `|a| + |b| = |a + b|`).
pub(super) fn same_sign(a: Iv, b: Iv) -> bool {
    (a.lo >= 0.0 && b.lo >= 0.0) || (a.hi <= 0.0 && b.hi <= 0.0)
}

/// One operation on intervals with error bounds; `Err` explains a domain or range problem.
/// The propagation of `|δa| ≤ A_a + R_a|a|` through each operation:
/// - `a ± b`: `A_a + A_b + max(R_a, R_b)|s|` when no cancellation can occur, else all absolute;
/// - `a·b`: `(R_a + R_b + R_aR_b)|s| + A_b·max|a|(1 + R_a) + A_a·max|b|(1 + R_b) + A_aA_b`;
/// - `a/b`: `ρA_a/m + ρ(R_a + R_b + A_b/m)|s|` with `m = min|b|`, `ρ = 1/(1 − R_b − A_b/m)`;
/// - `√a`: `R_a|s|` (+ `A_a/(2√min a)`, or `√A_a + √R_a·|s|` when `a` can be 0);
/// - `exp a`: `D·e^D·|s|` with `D = A_a + R_a·max|a|`; `log a`: `ε/(1 − ε)`, `ε = A_a/min a + R_a`;
/// - `|a|`, `−a`: unchanged; `min`, `max`: `max(A) + max(R)|s|` for operands ≥ 0, else absolute.
pub(super) fn apply(f: Func, a: St, b: St, same: bool) -> std::result::Result<St, String> {
    let (av, bv) = (a.v, b.v);
    let out = match f {
        Func::Neg => St {
            v: Iv {
                lo: -av.hi,
                hi: -av.lo,
            },
            ..a
        },
        Func::Abs => St {
            v: Iv {
                lo: av.minabs(),
                hi: av.maxabs(),
            },
            ..a
        },
        Func::Min | Func::Max => {
            let v = if f == Func::Min {
                Iv {
                    lo: av.lo.min(bv.lo),
                    hi: av.hi.min(bv.hi),
                }
            } else {
                Iv {
                    lo: av.lo.max(bv.lo),
                    hi: av.hi.max(bv.hi),
                }
            };
            if av.lo >= 0.0 && bv.lo >= 0.0 {
                St {
                    v,
                    a: a.a.max(b.a),
                    r: a.r.max(b.r),
                }
            } else {
                capped(St {
                    v,
                    a: a.abs().max(b.abs()),
                    r: 0.0,
                })
            }
        }
        Func::Add | Func::Sub => {
            let v = real_range(f, av, bv, false).to_f32();
            let no_cancel = if f == Func::Add {
                same_sign(av, bv)
            } else {
                same_sign(
                    av,
                    Iv {
                        lo: -bv.hi,
                        hi: -bv.lo,
                    },
                )
            };
            if no_cancel {
                rounded(v, a.a + b.a, a.r.max(b.r), U32, U64)
            } else {
                rounded(v, a.abs() + b.abs(), 0.0, U32, U64)
            }
        }
        Func::Mul => {
            let v = real_range(f, av, bv, same).to_f32();
            let pr = a.r + b.r + a.r * b.r;
            let pa = b.a * av.maxabs() * (1.0 + a.r) + a.a * bv.maxabs() * (1.0 + b.r) + a.a * b.a;
            rounded(v, pa, pr, U32, U64)
        }
        Func::Div => {
            if bv.lo <= 0.0 && bv.hi >= 0.0 {
                return Err(format!(
                    "the divisor may be 0 on this data: it ranges over {}",
                    range(bv)
                ));
            }
            let v = real_range(f, av, bv, false).to_f32();
            let m = bv.minabs();
            let shrink = b.r + b.a / m;
            if shrink < 0.5 {
                let rho = 1.0 / (1.0 - shrink);
                rounded(v, rho * a.a / m, rho * (a.r + shrink), U32, U64)
            } else {
                rounded(v, v.hi - v.lo, 0.0, U32, U64)
            }
        }
        Func::Sqrt => {
            if av.lo < 0.0 {
                return Err(format!(
                    "sqrt may get a negative value on this data: its argument ranges over {}",
                    range(av)
                ));
            }
            let v = real_range(f, av, bv, false).to_f32();
            let (pa, pr) = if a.a == 0.0 {
                (0.0, a.r)
            } else if av.lo > 0.0 {
                (a.a / (2.0 * av.lo.sqrt()), a.r)
            } else {
                (a.a.sqrt(), a.r.sqrt())
            };
            rounded(v, pa, pr, U32, U64)
        }
        Func::Exp => {
            // The engine's exp: within 4 ulp of f32.
            let v = real_range(f, av, bv, false).loose(8.0 * U32).to_f32();
            let dd = a.abs();
            rounded(v, 0.0, dd * dd.exp(), 8.0 * U32, 4.0 * U64)
        }
        Func::Log => {
            if av.lo <= 0.0 {
                return Err(format!(
                    "log may get a value <= 0 on this data: its argument ranges over {}",
                    range(av)
                ));
            }
            let v = real_range(f, av, bv, false).loose(8.0 * U32).to_f32();
            let eps = a.a / av.lo + a.r;
            let pa = if eps < 0.5 {
                eps / (1.0 - eps)
            } else {
                v.hi - v.lo
            };
            rounded(v, pa, 0.0, 8.0 * U32, 4.0 * U64)
        }
    };
    let top = out.v.maxabs();
    if top > f32::MAX as f64 || top.is_nan() {
        return Err(format!(
            "this may reach {} on this data, beyond the f32 range (3.4e38)",
            num(if out.v.hi.abs() >= out.v.lo.abs() {
                out.v.hi
            } else {
                out.v.lo
            })
        ));
    }
    Ok(out)
}

/// `+`, `0` (constant), `−`, or unknown: how a final-step value moves as acc grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mono {
    Up,
    Flat,
    Down,
    Any,
}

impl Mono {
    pub(super) fn neg(self) -> Mono {
        match self {
            Mono::Up => Mono::Down,
            Mono::Down => Mono::Up,
            m => m,
        }
    }
    pub(super) fn plus(self, o: Mono) -> Mono {
        match (self, o) {
            (Mono::Flat, m) | (m, Mono::Flat) => m,
            (a, b) if a == b => a,
            _ => Mono::Any,
        }
    }
    /// Product of signs (`Flat` = 0).
    pub(super) fn times(self, o: Mono) -> Mono {
        match (self, o) {
            (Mono::Flat, _) | (_, Mono::Flat) => Mono::Flat,
            (Mono::Any, _) | (_, Mono::Any) => Mono::Any,
            (a, b) if a == b => Mono::Up,
            _ => Mono::Down,
        }
    }
    /// The sign of the values of an interval (`Any` when it holds both signs).
    pub(super) fn sign(v: Iv) -> Mono {
        if v.lo == 0.0 && v.hi == 0.0 {
            Mono::Flat
        } else if v.lo >= 0.0 {
            Mono::Up
        } else if v.hi <= 0.0 {
            Mono::Down
        } else {
            Mono::Any
        }
    }
}

/// Checks the final step over keys in `keys`: defined (no NaN) and non-decreasing in acc.
pub(super) fn check_final(text: &str, p: &Program, keys: Iv) -> std::result::Result<(), ExprError> {
    let mut st: Vec<(Iv, Mono)> = Vec::with_capacity(p.nodes.len());
    for n in &p.nodes {
        let (v, m) = match n.op {
            Op::Acc => (keys, Mono::Up),
            Op::Const(c) => (Iv::point(c), Mono::Flat),
            Op::X | Op::Y => unreachable!("the final step sees acc only"),
            Op::Apply(f, a, b) => {
                let ((av, am), (bv, bm)) = (st[a as usize], st[b as usize]);
                let (sa, sb) = (Mono::sign(av), Mono::sign(bv));
                let bad = |what: &str| {
                    ExprError::at(
                        text,
                        n.at,
                        format!(
                            "{what} for the keys of this data (acc in {}): it ranges over {}",
                            range(keys),
                            range(av)
                        ),
                    )
                };
                // In f64 only: the final step runs on the reference keys.
                let v = real_range(f, av, bv, a == b);
                match f {
                    Func::Neg => (v, am.neg()),
                    Func::Abs => (v, am.times(sa)),
                    Func::Add => (v, am.plus(bm)),
                    Func::Sub => (v, am.plus(bm.neg())),
                    Func::Min | Func::Max => (v, am.plus(bm)),
                    // Δ(ab) = Δa·b₂ + a₁·Δb and Δ(a/b) = Δa/b₂ − a₁·Δb/(b₁b₂): the signs of
                    // the terms over the intervals give the direction.
                    Func::Mul => (v, am.times(sb).plus(sa.times(bm))),
                    Func::Div => {
                        if bv.lo <= 0.0 && bv.hi >= 0.0 {
                            return Err(ExprError::at(
                                text,
                                n.at,
                                format!(
                                    "the divisor may be 0 for the keys of this data (acc in {}): it ranges over {}",
                                    range(keys),
                                    range(bv)
                                ),
                            ));
                        }
                        (v, am.times(sb).plus(sa.times(bm).neg()))
                    }
                    Func::Sqrt if av.lo < 0.0 => return Err(bad("sqrt may get a negative value")),
                    Func::Log if av.lo <= 0.0 => return Err(bad("log may get a value <= 0")),
                    Func::Sqrt | Func::Exp | Func::Log => (v, am),
                }
            }
        };
        if v.lo.is_nan() || v.hi.is_nan() {
            return Err(ExprError::at(
                text,
                n.at,
                format!(
                    "this is undefined for some keys of this data (acc in {})",
                    range(keys)
                ),
            ));
        }
        st.push((v, m));
    }
    match st.last().map(|s| s.1) {
        Some(Mono::Up | Mono::Flat) => Ok(()),
        _ => Err(ExprError::at(
            text,
            p.whole,
            format!(
                "the final step must not decrease as acc grows, and this could not be shown for acc in {} (the keys of this data)",
                range(keys)
            ),
        )),
    }
}

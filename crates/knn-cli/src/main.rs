//! `knn`: exact k-nearest neighbours from the command line.
//!
//! With no arguments it prints the help; `knn bench` runs the seed-000 experiment on built-in
//! random data.

mod args;
mod bench;
mod checkpoint;
mod classify;
mod data;
mod info;
mod output;
mod progress;
mod run;
mod timing;

use clap::{CommandFactory, Parser};
use std::process::ExitCode;

fn main() -> ExitCode {
    knn::pages::fresh_pages_for_large_buffers();
    let cli = args::Cli::parse();
    let quiet = cli.quiet;
    let Some(command) = cli.command else {
        // No command: what the tool does and how to start, not a computation.
        let mut help = args::Cli::command();
        return match help.print_long_help() {
            Ok(()) => ExitCode::SUCCESS,
            Err(_) => ExitCode::from(2),
        };
    };
    let result = match command {
        args::Command::Search(a) => run::search(&a, quiet),
        args::Command::Graph(a) => run::graph(&a, quiet),
        args::Command::Generate(a) => data::generate(&a, quiet)
            .map_err(|e| format_hint(e, "name it with --format (fvecs, npy, csv)")),
        args::Command::Verify(a) => run::verify(&a, quiet).map_err(|e| {
            format_hint(
                e,
                "name the file with one of these extensions (knn search writes .npy, .ivecs or \
                 .csv)",
            )
        }),
        args::Command::Bench(a) => bench::bench(&a, quiet),
        args::Command::Classify(a) => classify::classify(&a, quiet),
        args::Command::Info => info::info(),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// An unknown file extension names the fix that the command has: `hint` replaces the
/// library's "name the format explicitly".
fn format_hint(e: anyhow::Error, hint: &str) -> anyhow::Error {
    match e.downcast_ref::<knn_io::IoError>() {
        Some(io @ knn_io::IoError::UnknownFormat { .. }) => {
            anyhow::anyhow!(
                "{}",
                io.to_string().replace("name the format explicitly", hint)
            )
        }
        _ => e,
    }
}

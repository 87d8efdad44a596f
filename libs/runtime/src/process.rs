//! A service as a process: its flags, its logs and traces, its `run` on a
//! multi-threaded runtime, and the exit code. Each service's own binary and
//! the image's one multi-call `switchyard` binary (which answers to every
//! service's name) go through [`service_main`], so both are the same program.

use std::fmt::Display;
use std::process::ExitCode;

use clap::{Args, FromArgMatches};

/// The service binary `bin` (`switchyard-<service>`): parses `A` from the
/// process's arguments (help and errors under that name), starts tracing as
/// `<service>` at `info`, runs `run` and flushes the traces. An error is
/// printed and exits 2.
pub fn service_main<A, F, E>(
    bin: &'static str,
    about: &'static str,
    run: impl FnOnce(A) -> F,
) -> ExitCode
where
    A: Args + FromArgMatches,
    F: Future<Output = Result<(), E>>,
    E: Display,
{
    let service = bin.strip_prefix("switchyard-").unwrap_or(bin);
    // After the flags: their struct's doc comment is not the program's about.
    let command = A::augment_args(clap::Command::new(bin))
        .version(env!("CARGO_PKG_VERSION"))
        .about(about)
        .long_about(None);
    let args = command
        .try_get_matches()
        .and_then(|matches| A::from_arg_matches(&matches))
        .unwrap_or_else(|err| err.exit());
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: start the runtime: {err}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        // In the runtime: traces are exported from a task of it.
        let telemetry = crate::init_tracing(service, "info");
        let result = run(args).await;
        telemetry.flush().await;
        match result {
            Ok(()) => ExitCode::SUCCESS,
            Err(err) => {
                eprintln!("error: {err}");
                ExitCode::from(2)
            }
        }
    })
}

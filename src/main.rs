use std::io::Write;

use clap::{CommandFactory, FromArgMatches};

#[tokio::main]
async fn main() {
    // Called by kubectl as the plugin `kubectl-snapdrain`: help and hints say `kubectl snapdrain`.
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let program = snapdrain_cli::cli::invocation::program_name(&argv0);
    snapdrain_cli::cli::invocation::set_program(program);
    let matches = snapdrain_cli::cli::Cli::command()
        .bin_name(program)
        .display_name(program)
        .get_matches();
    let cli = match snapdrain_cli::cli::Cli::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    snapdrain::telemetry::init_logging_with_default(cli.command.default_log_filter());
    let code = match snapdrain_cli::cli::run(cli).await {
        Ok(code) => code,
        Err(e) => {
            eprintln!("Error: {e:?}");
            snapdrain_cli::cli::follow::exit::ERROR
        }
    };
    let _ = std::io::stdout().flush();
    // Exit here rather than by returning: a prompt's blocked stdin read (Ctrl-C, then a second Ctrl-C)
    // would otherwise keep the runtime waiting for that thread at shutdown.
    std::process::exit(i32::from(code));
}

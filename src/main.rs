use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = snapdrain_cli::cli::Cli::parse();
    snapdrain::telemetry::init_logging_with_default(cli.command.default_log_filter());
    snapdrain_cli::cli::run(cli).await
}

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = snapdrain::cli::Cli::parse();
    snapdrain::telemetry::init_logging_with_default(cli.command.default_log_filter());
    snapdrain::cli::run(cli).await
}

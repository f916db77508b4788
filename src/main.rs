use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = snapdrain::cli::Cli::parse();
    snapdrain::telemetry::init_logging();
    snapdrain::cli::run(cli).await
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    chirp::startup::main().await
}

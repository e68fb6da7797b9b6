/// mimalloc: measured faster than the system allocator on chirp's allocation-heavy hydration
/// path (see BENCHMARKS.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    chirp::startup::main().await
}

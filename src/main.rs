/// mimalloc: measured faster than the system allocator on chirp's allocation-heavy hydration
/// path (decision 0013). Built with `no_thp`: mimalloc otherwise asks for transparent huge
/// pages (`madvise`), and every 2 MiB page it purged and touched again was zeroed by the kernel,
/// which was half of chirp's CPU during a big fan-out
/// (docs/decisions/0013-mimalloc-without-huge-pages.md). The feature only drops that request:
/// on a host whose THP setting is `always` rather than `madvise`, set `MIMALLOC_ALLOW_THP=0` in
/// chirp's environment (docs/cache.md, "Running chirp: memory").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    chirp::startup::main().await
}

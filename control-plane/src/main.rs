//! `control-plane --listen ADDR --public-url URL`.

use std::sync::Arc;

use clap::Parser;
use control_plane::{AppState, Metrics, app};
use shared::Datastore;
use shared::config::{self, Common};

#[derive(Debug, Parser)]
#[command(
    name = "control-plane",
    about = "Gatehouse control plane: REST API, console, OAuth authorization server"
)]
struct Args {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    /// Public base URL of the control plane.
    #[arg(long, env = "GATEHOUSE_CONTROL_URL")]
    public_url: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    config::init_tracing();
    let args = Args::parse();
    let common = Common::from_env()?;
    let ds = Datastore::connect(common.database_url.expose(), common.db_max_connections).await?;
    let state = Arc::new(AppState {
        ds,
        public_url: args.public_url.trim_end_matches('/').to_owned(),
        metrics: Metrics::new(),
    });
    let listener = tokio::net::TcpListener::bind(&args.listen).await?;
    tracing::info!(listen = %args.listen, "control plane listening");
    axum::serve(listener, app(state))
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

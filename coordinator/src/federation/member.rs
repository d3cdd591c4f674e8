//! `starling-coordinator gossip-member`: the federation's gossip alone, with a
//! synthetic site digest, for benchmarks and experiments with many members
//! on one machine. It prints what it sees as JSON lines on stdout and takes
//! commands on stdin (`bump`: publish a new digest; `leave`: leave and exit).
//! Like a coordinator, it publishes its digest at least every [`super::Gossip::digest_refresh`], so a lost digest is caught
//! up. It runs until `leave` or a signal; a closed stdin only stops the
//! commands.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context as _;
use starling_proto::{SiteDigest, SiteId, PROTOCOL_VERSION};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use super::{ClusterKey, Gossip, GossipConfig};

/// Settings of `gossip-member`.
#[derive(Debug, Clone, clap::Args)]
pub struct GossipMemberArgs {
    /// This member's site name.
    #[arg(long, value_name = "NAME")]
    pub site: String,
    /// UDP address to bind (and advertise).
    #[arg(long, value_name = "ADDR")]
    pub bind: SocketAddr,
    /// A member to join through; repeat for several.
    #[arg(long = "seed", value_name = "ADDR")]
    pub seeds: Vec<SocketAddr>,
    /// The cluster key, base64 of 32 bytes.
    #[arg(
        long,
        env = "STARLING_CLUSTER_KEY",
        value_name = "KEY",
        hide_env_values = true
    )]
    pub cluster_key: String,
    /// Run SWIM without Lifeguard (as before it), for comparison.
    #[arg(long)]
    pub no_lifeguard: bool,
}

fn synthetic_digest(site: &SiteId, bind: SocketAddr, version: u64) -> SiteDigest {
    let mut api_url = heapless::String::new();
    let _ = api_url.push_str(&format!("http://{bind}"));
    SiteDigest {
        v: PROTOCOL_VERSION,
        site: site.clone(),
        version,
        api_url,
        nodes: 0,
        classes: heapless::Vec::new(),
        power: heapless::Vec::new(),
        pending: 0,
        running: 0,
        slack_ms: None,
        watts: 0.0,
        artifacts: heapless::Vec::new(),
    }
}

async fn print(line: &serde_json::Value) -> anyhow::Result<()> {
    let mut stdout = tokio::io::stdout();
    stdout.write_all(format!("{line}\n").as_bytes()).await?;
    stdout.flush().await?;
    Ok(())
}

/// Runs the member until stdin says `leave` (or the process is killed).
pub async fn run(args: GossipMemberArgs) -> anyhow::Result<()> {
    let key = Arc::new(ClusterKey::parse(&args.cluster_key)?);
    let site = SiteId::new(&args.site).with_context(|| format!("--site {:?}", args.site))?;
    let gossip = Gossip::start(
        GossipConfig {
            site: site.clone(),
            bind: args.bind,
            advertise: None,
            seeds: args.seeds.clone(),
            lifeguard: !args.no_lifeguard,
            // Unsigned digests: these members have no credentials.
            signing: None,
        },
        key,
    )
    .await?;
    let mut events = gossip.subscribe();
    let mut version = crate::task::unix_now_ms();
    gossip
        .publish(&synthetic_digest(&site, args.bind, version))
        .map_err(anyhow::Error::msg)?;
    print(&serde_json::json!({"event": "ready", "site": site.as_str(), "addr": gossip.local_addr().to_string()})).await?;
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    let mut stdin_open = true;
    // As a coordinator does: the digest is published again at least every
    // refresh period (newcomers get it from their seed by state sync).
    let mut published = tokio::time::Instant::now();
    let mut check = tokio::time::interval(super::DIGEST_CHECK);
    loop {
        tokio::select! {
            _ = check.tick(), if published.elapsed() >= gossip.digest_refresh() => {
                published = tokio::time::Instant::now();
                version = crate::task::unix_now_ms().max(version + 1);
                gossip.publish(&synthetic_digest(&site, args.bind, version)).map_err(anyhow::Error::msg)?;
            }
            event = events.recv() => match event {
                Ok(event) => print(&serde_json::to_value(&event)?).await?,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(missed)) => {
                    print(&serde_json::json!({"event": "lagged", "missed": missed})).await?;
                }
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return Ok(()),
            },
            line = lines.next_line(), if stdin_open => match line?.as_deref().map(str::trim) {
                Some("bump") => {
                    published = tokio::time::Instant::now();
                    version = crate::task::unix_now_ms().max(version + 1);
                    gossip.publish(&synthetic_digest(&site, args.bind, version)).map_err(anyhow::Error::msg)?;
                    print(&serde_json::json!({"event": "published", "version": version})).await?;
                }
                Some("leave") => {
                    gossip.leave().await;
                    return Ok(());
                }
                None => stdin_open = false,
                Some("") => {}
                Some(other) => {
                    print(&serde_json::json!({"event": "error", "message": format!("unknown command {other:?}; use bump or leave")})).await?;
                }
            },
        }
    }
}

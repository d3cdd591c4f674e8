//! `starling-coordinator federation init | issue | revoke`: the trust root's
//! commands, run on the member that holds the root (made by `init` on the
//! first site). `issue` writes a new site's credentials bundle (its key,
//! its certificate, the root's public key; never the root's private key);
//! `revoke` prints a root-signed revocation to hand to any member.

use std::path::{Path, PathBuf};

use base64::Engine;
use serde::{Deserialize, Serialize};
use starling_proto::SiteId;

use super::{write_private, CredentialsError, RandomError, TrustRoot};
use crate::config::{parse_duration, ConfigError, DEFAULT_DATA_DIR};
use crate::task::unix_now_ms;

/// The root's file name in the data directory.
pub const ROOT_FILE: &str = "federation-root.json";
/// The first site's credentials file name in the data directory.
pub const SITE_CREDENTIALS_FILE: &str = "site-credentials.json";
/// The root file's format tag.
const ROOT_FORMAT: &str = "starling-federation-root/1";

/// The federation's trust root commands.
#[derive(Debug, Clone, clap::Args)]
pub struct FederationArgs {
    #[command(subcommand)]
    command: FederationCommand,
}

#[derive(Debug, Clone, clap::Subcommand)]
enum FederationCommand {
    /// Create the federation's trust root on its first site, and this site's credentials.
    Init {
        /// This site's name (the --site it will serve).
        #[arg(long, value_name = "NAME")]
        site: String,
        /// Where the root and the credentials are written (0600).
        #[arg(long, env = "STARLING_DATA_DIR", value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
    /// Issue a new site's credentials from the trust root (run on the member holding it).
    Issue {
        /// The new site's name (the --site it will serve).
        #[arg(long, value_name = "NAME")]
        site: String,
        /// Where to write the credentials (0600; an existing file is not replaced).
        #[arg(long, value_name = "FILE")]
        out: PathBuf,
        /// How long the certificate stays valid, like 8760h [default: until revoked].
        #[arg(long, value_name = "DURATION")]
        valid_for: Option<String>,
        /// The directory holding the trust root (`federation-root.json`).
        #[arg(long, env = "STARLING_DATA_DIR", value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
    /// Revoke a site: print a root-signed revocation (JSON) to POST to any member.
    Revoke {
        /// The site to revoke.
        #[arg(long, value_name = "NAME")]
        site: String,
        /// Write the revocation here instead of standard output.
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// The directory holding the trust root (`federation-root.json`).
        #[arg(long, env = "STARLING_DATA_DIR", value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
        data_dir: PathBuf,
    },
}

/// Why a federation command failed.
#[derive(Debug, thiserror::Error)]
pub enum FederationCommandError {
    /// A site name that is not one.
    #[error("--site {site:?} is not a valid site name: {error}")]
    Site {
        /// The name given.
        site: String,
        /// Why.
        error: starling_proto::IdError,
    },
    /// `init` found a root already there.
    #[error("{0} already exists: this member already holds the federation's trust root; issue credentials for a new site with `starling-coordinator federation issue --site NAME --out FILE`")]
    RootExists(PathBuf),
    /// No root to issue or revoke with.
    #[error("cannot read the trust root {path}: {source}; run this on the member where `starling-coordinator federation init` made it (or pass its --data-dir)")]
    NoRoot {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The root file is not one.
    #[error("{0} is not a Starling federation root file")]
    BadRoot(PathBuf),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The credentials could not be written.
    #[error("cannot write the credentials: {0}")]
    Credentials(#[from] CredentialsError),
    /// `--valid-for` is not a duration.
    #[error(transparent)]
    Duration(#[from] ConfigError),
    /// No randomness for a key.
    #[error(transparent)]
    Random(#[from] RandomError),
}

/// The root file (JSON).
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RootFile {
    format: String,
    /// The root's ed25519 secret, base64.
    root_key: String,
    /// Its public key, hex (what every credentials bundle carries).
    root_public_key: String,
}

fn site_id(site: &str) -> Result<SiteId, FederationCommandError> {
    SiteId::new(site).map_err(|error| FederationCommandError::Site {
        site: site.to_string(),
        error,
    })
}

fn read_root(dir: &Path) -> Result<TrustRoot, FederationCommandError> {
    let path = dir.join(ROOT_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| FederationCommandError::NoRoot {
        path: path.clone(),
        source,
    })?;
    let file: RootFile =
        serde_json::from_str(&text).map_err(|_| FederationCommandError::BadRoot(path.clone()))?;
    let secret: [u8; 32] = base64::engine::general_purpose::STANDARD
        .decode(&file.root_key)
        .ok()
        .and_then(|bytes| bytes.try_into().ok())
        .filter(|_| file.format == ROOT_FORMAT)
        .ok_or(FederationCommandError::BadRoot(path))?;
    Ok(TrustRoot::from_secret(&secret))
}

/// Runs a `federation` subcommand; what it made and what to do next go to
/// standard output (a revocation without --out too), nothing secret.
pub fn run(args: &FederationArgs) -> Result<(), FederationCommandError> {
    match &args.command {
        FederationCommand::Init { site, data_dir } => init(site, data_dir),
        FederationCommand::Issue {
            site,
            out,
            valid_for,
            data_dir,
        } => {
            let site = site_id(site)?;
            let root = read_root(data_dir)?;
            let now = unix_now_ms();
            let expires = valid_for
                .as_deref()
                .map(|text| parse_duration("--valid-for", text))
                .transpose()?
                .map(|valid| {
                    now.saturating_add(u64::try_from(valid.as_millis()).unwrap_or(u64::MAX))
                });
            root.issue(&site, now, expires)?.write_new(out)?;
            println!(
                "Wrote the credentials of site {site} to {}.\n\
                 Copy it to that site's coordinator over a private channel (it holds the site's key), \
                 then start it with\n  starling-coordinator serve --site {site} --site-credentials FILE \
                 --cluster-key-file KEYFILE --seed ADDR ...",
                out.display()
            );
            Ok(())
        }
        FederationCommand::Revoke {
            site,
            out,
            data_dir,
        } => {
            let site = site_id(site)?;
            let revocation = read_root(data_dir)?.revoke(&site, unix_now_ms());
            let json = serde_json::to_string(&revocation).unwrap_or_default();
            match out {
                Some(path) => {
                    write_private(path, format!("{json}\n").as_bytes()).map_err(|source| {
                        FederationCommandError::Write {
                            path: path.clone(),
                            source,
                        }
                    })?;
                    eprintln!("Wrote the revocation of site {site} to {}.", path.display());
                }
                None => println!("{json}"),
            }
            eprintln!(
                "Hand it to any member; members pass it on to every peer:\n  curl -X POST -H 'Content-Type: application/json' \
                 --data @REVOCATION http://MEMBER:7878/api/v1/federation/revocations\n\
                 Certificates of {site} issued until now are refused; credentials issued later are valid again."
            );
            Ok(())
        }
    }
}

fn init(site: &str, dir: &Path) -> Result<(), FederationCommandError> {
    let site = site_id(site)?;
    let root_path = dir.join(ROOT_FILE);
    if root_path.exists() {
        return Err(FederationCommandError::RootExists(root_path));
    }
    let root = TrustRoot::generate()?;
    let file = RootFile {
        format: ROOT_FORMAT.into(),
        root_key: base64::engine::general_purpose::STANDARD.encode(root.secret()),
        root_public_key: hex::encode(root.public_key().as_bytes()),
    };
    let text = serde_json::to_string_pretty(&file).unwrap_or_default();
    write_private(&root_path, format!("{text}\n").as_bytes()).map_err(|source| {
        FederationCommandError::Write {
            path: root_path.clone(),
            source,
        }
    })?;
    let credentials = dir.join(SITE_CREDENTIALS_FILE);
    root.issue(&site, unix_now_ms(), None)?
        .write_new(&credentials)?;
    println!(
        "Created the federation's trust root in {root} (keep it on this member, owner-only, and back it up) \
         and the credentials of site {site} in {credentials}.\n\
         Start this site with\n  starling-coordinator serve --site {site} --site-credentials {credentials} \
         --cluster-key-file KEYFILE ...\n\
         For each other site, issue its credentials here and copy them to it over a private channel:\n  \
         starling-coordinator federation issue --site NAME --out NAME.credentials.json",
        root = root_path.display(),
        credentials = credentials.display(),
    );
    Ok(())
}

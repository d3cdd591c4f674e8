//! `starling image configure`: writes a join file (`starling.toml`) into a
//! device image's boot partition, like `balena os configure`, without
//! mounting anything. `sfdisk --json` reads the partition table (GPT or MBR)
//! and mtools writes into the FAT file system at the partition's offset, so
//! it needs neither root nor loop devices.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use starling_net::JoinFile;

/// GPT type of an EFI System Partition (the amd64 images' boot partition).
const GPT_ESP: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
/// GPT type "Microsoft basic data", which FAT partitions also use.
const GPT_BASIC_DATA: &str = "EBD0A0A2-B9E5-4433-87C0-68B6B72699C7";
/// MBR types of FAT partitions: FAT32 (LBA or CHS), FAT16 LBA, EFI.
const MBR_FAT: [&str; 5] = ["b", "c", "e", "6", "ef"];

/// Why an image could not be configured.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A tool this needs is not installed.
    #[error("`{tool}` is needed to write into an image and was not found; install it with: apt install {package}")]
    MissingTool {
        /// The command.
        tool: &'static str,
        /// The Debian package that has it.
        package: &'static str,
    },
    /// A tool failed.
    #[error("{tool} failed on {image}: {stderr}")]
    ToolFailed {
        /// The command.
        tool: &'static str,
        /// The image.
        image: PathBuf,
        /// What it printed.
        stderr: String,
    },
    /// The image has no FAT boot partition.
    #[error("{0} has no FAT boot partition (an EFI system partition, or an MBR FAT32 partition); is it a Starling image?")]
    NoBootPartition(PathBuf),
    /// The settings are not a valid join file.
    #[error(transparent)]
    JoinFile(#[from] starling_net::JoinFileError),
    /// A local file operation failed.
    #[error("{0}")]
    Io(String),
}

/// Where the join file went.
#[derive(Debug, serde::Serialize)]
pub struct Configured {
    /// The image.
    pub image: PathBuf,
    /// The partition's number, from 1.
    pub partition: usize,
    /// The partition's byte offset in the image.
    pub offset: u64,
    /// The file's name in the partition.
    pub file: &'static str,
}

#[derive(Debug, Deserialize)]
struct Dump {
    partitiontable: Table,
}

#[derive(Debug, Deserialize)]
struct Table {
    #[serde(default)]
    sectorsize: Option<u64>,
    #[serde(default)]
    partitions: Vec<Partition>,
}

#[derive(Debug, Deserialize)]
struct Partition {
    start: u64,
    #[serde(rename = "type")]
    kind: String,
}

/// Writes `file` as `starling.toml` into the boot partition of `image`,
/// replacing one already there.
pub fn configure(image: &Path, file: &JoinFile) -> Result<Configured, ImageError> {
    let text = file.render()?;
    let (partition, offset) = boot_partition(image)?;
    let staging = tempfile::NamedTempFile::new()
        .map_err(|e| ImageError::Io(format!("cannot make a temporary file: {e}")))?;
    std::fs::write(staging.path(), text)
        .map_err(|e| ImageError::Io(format!("cannot write a temporary file: {e}")))?;
    let target = format!("{}@@{offset}", image.display());
    let destination = format!("::{}", starling_net::join_file::FILE_NAME);
    // -o: overwrite an existing file without asking; -D o does the same for
    // the name clash prompt of older mtools.
    let args = [
        "-o".as_ref(),
        "-D".as_ref(),
        "o".as_ref(),
        "-i".as_ref(),
        target.as_ref(),
        staging.path().as_os_str(),
        destination.as_ref(),
    ];
    tool("mcopy", "mtools", image, &args)?;
    Ok(Configured {
        image: image.to_owned(),
        partition,
        offset,
        file: starling_net::join_file::FILE_NAME,
    })
}

/// Reads the join file back out of an image's boot partition, or `None`
/// when there is none (tests and operators checking a configured image).
pub fn read_back(image: &Path) -> Result<Option<String>, ImageError> {
    let (_, offset) = boot_partition(image)?;
    let target = format!("{}@@{offset}", image.display());
    let source = format!("::{}", starling_net::join_file::FILE_NAME);
    match tool(
        "mtype",
        "mtools",
        image,
        &["-i".as_ref(), target.as_ref(), source.as_ref()],
    ) {
        Ok(text) => Ok(Some(text)),
        Err(ImageError::ToolFailed { stderr, .. }) if stderr.contains("not found") => Ok(None),
        Err(other) => Err(other),
    }
}

/// The boot partition's number and byte offset.
fn boot_partition(image: &Path) -> Result<(usize, u64), ImageError> {
    if !image.is_file() {
        return Err(ImageError::Io(format!(
            "{} is not an image file",
            image.display()
        )));
    }
    let json = tool(
        "sfdisk",
        "fdisk",
        image,
        &["--json".as_ref(), image.as_os_str()],
    )?;
    let dump: Dump = serde_json::from_str(&json).map_err(|e| ImageError::ToolFailed {
        tool: "sfdisk",
        image: image.to_owned(),
        stderr: format!("unexpected output: {e}"),
    })?;
    let sector = dump.partitiontable.sectorsize.unwrap_or(512);
    dump.partitiontable
        .partitions
        .iter()
        .enumerate()
        .find(|(_, p)| {
            let kind = p.kind.to_ascii_uppercase();
            kind == GPT_ESP
                || kind == GPT_BASIC_DATA
                || MBR_FAT.contains(&p.kind.to_ascii_lowercase().as_str())
        })
        .map(|(index, p)| (index + 1, p.start * sector))
        .ok_or_else(|| ImageError::NoBootPartition(image.to_owned()))
}

/// Runs `program` and returns its standard output.
fn tool(
    program: &'static str,
    package: &'static str,
    image: &Path,
    args: &[&std::ffi::OsStr],
) -> Result<String, ImageError> {
    // sfdisk lives in /sbin, which a user's PATH may lack.
    let found = which(program).ok_or(ImageError::MissingTool {
        tool: program,
        package,
    })?;
    let output = Command::new(found)
        .args(args)
        .env("MTOOLS_SKIP_CHECK", "1")
        .output()
        .map_err(|e| ImageError::Io(format!("cannot run {program}: {e}")))?;
    if !output.status.success() {
        return Err(ImageError::ToolFailed {
            tool: program,
            image: image.to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `program` on PATH, or in the sbin directories.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

//! First boot without a VM: the real agent, with the `--join-file` paths the
//! packaged unit gives it, waits for its join file, names the key of a bad
//! one, enrolls with a good one (written by `starling-agent join`), removes
//! the token from it, and comes back after a restart on its credentials; a
//! join file naming another coordinator's key enrolls nothing. And `starling
//! image configure` writes the join file into a real FAT partition of a
//! partitioned image. The unit's root helper, `starling-agent
//! import-join-file`, moves a card's token into the agent's state. (`deploy/test`
//! boots a whole image under qemu.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use starling_tests::{binary, Agent, Coordinator, Store};

/// Waits until the agent's log holds `needle`.
fn wait_for_log(agent: &Agent, needle: &str, timeout: Duration) {
    let start = Instant::now();
    while !agent.process.log().contains(needle) {
        assert!(
            start.elapsed() < timeout,
            "no {needle:?} in the agent's log after {timeout:?}:\n{}",
            agent.process.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn agent_with_join_files(boot_file: &Path) -> Agent {
    let boot_file = boot_file.to_owned();
    Agent::start_args("first-boot", move |dir| {
        vec![
            "--data-dir".into(),
            dir.into(),
            "--join-file".into(),
            boot_file.into(),
            "--join-file".into(),
            dir.join("join.toml").into(),
            "--telemetry-interval".into(),
            "500ms".into(),
            "--opencl".into(),
            "false".into(),
        ]
    })
}

/// `starling-agent join` with these settings into `file`.
fn join(coordinator: &Coordinator, file: &Path, key: &str, token: &str) {
    let mqtt_port = coordinator.mqtt.rsplit(':').next().unwrap();
    let out = Command::new(binary("starling-agent"))
        .args(["join", "--coordinator-url", &coordinator.rest])
        .args(["--join-token", token, "--coordinator-key", key])
        .args(["--node-id", "first-boot"])
        .args(["--broker", &format!("mqtt://127.0.0.1:{mqtt_port}")])
        .arg("--file")
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "starling-agent join: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_new_device_waits_for_its_join_file_enrolls_and_forgets_the_token() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let boot = tempfile::tempdir().unwrap();
    let boot_file = boot.path().join("starling.toml");
    let mut agent = agent_with_join_files(&boot_file);

    // Nothing yet: it waits and says once what it needs.
    wait_for_log(&agent, "waiting for", Duration::from_secs(20));
    assert!(agent.process.is_running(), "{}", agent.process.log());

    // A bad file: one line naming the key; still waiting, nothing enrolled.
    std::fs::write(
        &boot_file,
        "coordinator-url = \"http://127.0.0.1:1\"\ncoordinator-key = \"not-a-key\"\n",
    )
    .unwrap();
    wait_for_log(&agent, "key `coordinator-key`", Duration::from_secs(10));
    std::thread::sleep(Duration::from_secs(3));
    let log = agent.process.log();
    assert_eq!(
        log.matches("key `coordinator-key`").count(),
        1,
        "one line per bad file, not one per look:\n{log}"
    );
    assert!(agent.process.is_running());
    assert!(!agent.dir.path().join("credentials.json").exists());

    // The operator writes a good one: the agent enrolls and forgets the token.
    let token = coordinator.join_token();
    join(
        &coordinator,
        &boot_file,
        &coordinator.coordinator_key(),
        &token,
    );
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&boot_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the join file holds a secret");
    }
    let nodes = coordinator.wait_for_nodes(1, Duration::from_secs(30));
    assert_eq!(nodes[0]["id"], "first-boot", "{nodes}");
    wait_for_log(&agent, "removed the join token", Duration::from_secs(10));
    let after = std::fs::read_to_string(&boot_file).unwrap();
    assert!(
        !after.contains(&token),
        "the token is still in the file:\n{after}"
    );
    assert!(!after.contains("join-token"), "{after}");
    assert!(
        after.contains("coordinator-url"),
        "the other settings stay:\n{after}"
    );
    assert!(agent.dir.path().join("credentials.json").exists());

    // A restart (a reboot): back online on the kept credentials, no token.
    agent.restart();
    let start = Instant::now();
    loop {
        let log = agent.process.log();
        // One "connected" line per start, the only one naming
        // session_present: the restarted agent is in.
        if log.matches("session_present").count() >= 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{log}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let nodes = coordinator.wait_for_nodes(1, Duration::from_secs(30));
    assert_eq!(nodes.as_array().unwrap().len(), 1, "{nodes}");
    let log = agent.process.log();
    assert_eq!(
        log.matches("enrolled; removed the join token").count(),
        1,
        "{log}"
    );
    assert!(agent.process.is_running(), "{log}");
}

/// `starling-agent import-join-file FROM --into INTO`, as the unit runs it.
fn import(from: &Path, into: &Path) -> std::process::Output {
    Command::new(binary("starling-agent"))
        .arg("import-join-file")
        .arg(from)
        .arg("--into")
        .arg(into)
        .output()
        .unwrap()
}

#[test]
fn the_units_root_helper_moves_the_token_off_the_card_and_the_agent_enrolls_from_its_copy() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let boot = tempfile::tempdir().unwrap();
    let boot_file = boot.path().join("starling.toml");
    // The packaged order: the agent's own copy first, then the card.
    let card = boot_file.clone();
    let mut agent = Agent::start_args("first-boot", move |dir| {
        vec![
            "--data-dir".into(),
            dir.into(),
            "--join-file".into(),
            dir.join("join.toml").into(),
            "--join-file".into(),
            card.into(),
            "--opencl".into(),
            "false".into(),
        ]
    });
    let copy = agent.dir.path().join("join.toml");
    wait_for_log(&agent, "waiting for", Duration::from_secs(20));

    // Nothing on the card: nothing to do, and that is no error.
    let out = import(&boot_file, &copy);
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to import"));

    // A bad card: exit 1 naming the key, and both places as they were.
    let bad = "coordinator-url = \"http://127.0.0.1:1\"\ncoordinator-key = \"abc\"\njoin-token = \"stj_x\"\n";
    std::fs::write(&boot_file, bad).unwrap();
    let out = import(&boot_file, &copy);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("coordinator-key"));
    assert_eq!(std::fs::read_to_string(&boot_file).unwrap(), bad);
    assert!(!copy.exists());

    // A good card, as `starling image configure` or the operator wrote it:
    // the token leaves the card before the agent has even used it.
    let token = coordinator.join_token();
    join(
        &coordinator,
        &boot_file,
        &coordinator.coordinator_key(),
        &token,
    );
    let out = import(&boot_file, &copy);
    assert!(out.status.success(), "{out:?}");
    let card_after = std::fs::read_to_string(&boot_file).unwrap();
    assert!(!card_after.contains(&token), "{card_after}");
    assert!(card_after.contains("coordinator-url"), "{card_after}");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&copy).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "the agent's copy holds the secret");
    }

    // The waiting agent enrolls from its copy and then forgets the token there.
    let nodes = coordinator.wait_for_nodes(1, Duration::from_secs(30));
    assert_eq!(nodes[0]["id"], "first-boot", "{nodes}");
    wait_for_log(&agent, "removed the join token", Duration::from_secs(10));
    let copy_after = std::fs::read_to_string(&copy).unwrap();
    assert!(!copy_after.contains(&token), "{copy_after}");
    assert!(agent.dir.path().join("credentials.json").exists());

    // The next start's import finds no token on the card and changes nothing.
    let out = import(&boot_file, &copy);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(std::fs::read_to_string(&copy).unwrap(), copy_after);
    assert!(agent.process.is_running(), "{}", agent.process.log());
}

#[test]
fn a_join_file_with_another_coordinators_key_enrolls_nothing() {
    let _turn = crate::alongside();
    let coordinator = Coordinator::start(None, Store::Sqlite, &[]);
    let boot = tempfile::tempdir().unwrap();
    let boot_file = boot.path().join("starling.toml");
    // Whoever answers at the URL must hold the key the operator gave; here
    // the file names another key, as if the answer came from an impostor.
    let other_key = "ab".repeat(32);
    join(
        &coordinator,
        &boot_file,
        &other_key,
        &coordinator.join_token(),
    );
    let mut agent = agent_with_join_files(&boot_file);
    let start = Instant::now();
    while agent.process.is_running() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "{}",
            agent.process.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_ne!(agent.process.exit_code(), Some(0));
    let log = agent.process.log();
    assert!(log.contains("refusing it, nothing was saved"), "{log}");
    assert!(!agent.dir.path().join("credentials.json").exists());
}

/// A 64 MiB GPT image with an EFI system partition (FAT) from 1 MiB, made
/// with the tools an image build uses.
fn gpt_image(dir: &Path) -> PathBuf {
    let image = dir.join("disk.img");
    let fat = dir.join("fat.img");
    std::fs::File::create(&image)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut sfdisk = Command::new("sfdisk")
        .arg("--quiet")
        .arg(&image)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sfdisk (Debian's fdisk) is installed");
    use std::io::Write;
    sfdisk
        .stdin
        .take()
        .unwrap()
        .write_all(b"label: gpt\nstart=2048, size=61440, type=uefi\n")
        .unwrap();
    assert!(sfdisk.wait().unwrap().success());
    let status = Command::new("mkfs.vfat")
        .args(["-n", "STARLING", "-C"])
        .arg(&fat)
        .arg("30720")
        .stdout(std::process::Stdio::null())
        .status()
        .expect("mkfs.vfat (dosfstools) is installed");
    assert!(status.success());
    let bytes = std::fs::read(&fat).unwrap();
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    use std::io::{Seek, SeekFrom};
    file.seek(SeekFrom::Start(2048 * 512)).unwrap();
    file.write_all(&bytes).unwrap();
    image
}

fn starling(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(binary("starling"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn image_configure_writes_the_join_file_into_the_boot_partition() {
    let _turn = crate::alongside();
    let dir = tempfile::tempdir().unwrap();
    let image = gpt_image(dir.path());
    let key = "cd".repeat(32);
    let configure = |key: &str| {
        starling(&[
            "image".as_ref(),
            "configure".as_ref(),
            image.as_os_str(),
            "--coordinator-url".as_ref(),
            "http://10.0.0.2:7878".as_ref(),
            "--join-token".as_ref(),
            "stj_fleet".as_ref(),
            "--coordinator-key".as_ref(),
            key.as_ref(),
            "--json".as_ref(),
        ])
    };
    let out = configure(&key);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["partition"], 1);
    assert_eq!(done["offset"], 2048 * 512);

    // What a device will read: mtools, as the agent reads it once mounted.
    let read = Command::new("mtype")
        .env("MTOOLS_SKIP_CHECK", "1")
        .arg("-i")
        .arg(format!("{}@@{}", image.display(), 2048 * 512))
        .arg("::starling.toml")
        .output()
        .expect("mtools is installed");
    assert!(
        read.status.success(),
        "{}",
        String::from_utf8_lossy(&read.stderr)
    );
    let file = starling_net::JoinFile::parse(&String::from_utf8_lossy(&read.stdout)).unwrap();
    assert_eq!(file.join_token.as_deref(), Some("stj_fleet"));
    assert_eq!(file.coordinator_key, key);
    assert_eq!(file.broker_url(), "mqtt://10.0.0.2:1884");

    // Bad input is refused before anything is written; a second good run replaces the file.
    let before = std::fs::read(&image).unwrap();
    let out = configure("not-a-key");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("coordinator-key"));
    assert!(
        std::fs::read(&image).unwrap() == before,
        "a refused configure changed the image"
    );
    assert!(configure(&"ef".repeat(32)).status.success());

    // A file that is not a partitioned image is named as such.
    let plain = dir.path().join("plain.img");
    std::fs::write(&plain, vec![0u8; 1 << 20]).unwrap();
    let out = starling(&[
        "image".as_ref(),
        "configure".as_ref(),
        plain.as_os_str(),
        "--coordinator-url".as_ref(),
        "http://10.0.0.2:7878".as_ref(),
        "--join-token".as_ref(),
        "t".as_ref(),
        "--coordinator-key".as_ref(),
        key.as_ref(),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("no FAT boot partition") || stderr.contains("sfdisk failed"),
        "{stderr}"
    );
}

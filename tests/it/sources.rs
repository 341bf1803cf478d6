//! Source commands and backup tools can neither inject nor hang: a hostile file name reaches
//! a real sshd as a name, never as shell code; a source that goes silent is stopped, with its
//! children; SIGTERM ends a repair and every process it started within a second or so; a
//! tool that would prompt for a passphrase fails at once, even when intact runs on a
//! terminal; a source that cannot be used is said before anything runs.

#![allow(unsafe_code)]

use std::ffi::OsStr;
use std::fs;
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

/// A name that a shell parsing it again would run: a command substitution, quotes of both
/// kinds, a backslash and a space.
const HOSTILE: &[u8] = b"x$(touch pwned)'\"\\ y.jpg";

/// A tagged file of that name under `t/src`, a good copy of `t/src` at `t/copy`, and the
/// file damaged: its path and its good bytes.
fn damaged(t: &Tree) -> (PathBuf, Vec<u8>) {
    let name = t.path("src").join(OsStr::from_bytes(HOSTILE));
    let good = data(50_000, 7);
    fs::create_dir_all(t.path("src")).unwrap();
    fs::write(&name, &good).unwrap();
    intact!("tag", "-q", t.path("src")).expect_code(0);
    let ok = Command::new("cp")
        .arg("-a")
        .arg(t.path("src"))
        .arg(t.path("copy"))
        .status()
        .unwrap();
    assert!(ok.success());
    flip_byte(&name, 1000);
    (name, good)
}

/// An sshd of its own on 127.0.0.1 (a free port), letting in root with a key made for it;
/// stopped on drop.
struct Sshd {
    child: Child,
    port: u16,
    key: PathBuf,
}

impl Sshd {
    fn start(dir: &Path) -> Sshd {
        fs::create_dir_all(dir).unwrap();
        for key in ["host", "client"] {
            let made = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(dir.join(key))
                .status()
                .expect("ssh-keygen (openssh-client; .ci/run installs it)");
            assert!(made.success());
        }
        fs::copy(dir.join("client.pub"), dir.join("authorized_keys")).unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("sshd_config");
        fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nAuthorizedKeysFile {}\n\
                 PidFile {}\nStrictModes no\nUsePAM no\nPasswordAuthentication no\n\
                 KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n",
                dir.join("host").display(),
                dir.join("authorized_keys").display(),
                dir.join("sshd.pid").display()
            ),
        )
        .unwrap();
        // sshd's privilege separation directory.
        fs::create_dir_all("/run/sshd").unwrap();
        let child = Command::new("/usr/sbin/sshd")
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sshd (openssh-server; .ci/run installs it)");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "sshd did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Sshd {
            child,
            port,
            key: dir.join("client"),
        }
    }

    /// `ssh` to it, as a command line's start.
    fn ssh(&self) -> String {
        format!(
            "ssh -p {} -i {} -o BatchMode=yes -o StrictHostKeyChecking=no \
             -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR root@127.0.0.1",
            self.port,
            self.key.display()
        )
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The documented ssh pattern, through a real sshd: the hostile name is repaired (it reached
/// `cat` on the other side as one name), and nothing it holds ran on either side. `{}` in an
/// ssh command, or any placeholder inside quotes, is refused before anything runs.
#[test]
fn an_ssh_source_cannot_inject_through_a_hostile_name() {
    require_root!();
    let t = Tree::new();
    let (name, good) = damaged(&t);
    let sshd = Sshd::start(&t.path("sshd"));
    let home = PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()));
    let _ = fs::remove_file(home.join("pwned"));
    let copy = t.path("copy");
    let remote = format!("{} cat {}/{{ssh}}", sshd.ssh(), copy.display());
    let r = cmd!(
        "repair",
        "--no-state",
        "--discard-damaged",
        "--from-command",
        &remote,
        t.path("src")
    )
    .within(Duration::from_secs(60))
    .run()
    .expect_code(0);
    assert!(r.stdout.contains("repaired"), "{}", r.stdout);
    assert_eq!(fs::read(&name).unwrap(), good);
    for dir in [home.as_path(), t.root(), &t.path("src"), &copy] {
        assert!(!dir.join("pwned").exists(), "injected in {}", dir.display());
    }
    // The same with `{}`, which the remote shell would parse: refused, nothing run.
    flip_byte(&name, 1000);
    let unsafe_one = format!("{} cat {}/{{}}", sshd.ssh(), copy.display());
    for template in [
        unsafe_one,
        format!("cat \"{}/{{}}\"", copy.display()),
        format!("cat '{}'/'{{}}'", copy.display()),
    ] {
        let r = cmd!(
            "repair",
            "--no-state",
            "--from-command",
            &template,
            t.path("src")
        )
        .run()
        .expect_code(2);
        assert!(r.stderr.contains("--from-command"), "{}", r.stderr);
    }
    assert_ne!(fs::read(&name).unwrap(), good, "a refused command ran");
}

/// Whether a process whose command line is `words` still runs a few seconds on (a process
/// killed dies when next scheduled, and a zombie does not count).
fn outlives(words: &[&str]) -> bool {
    let start = Instant::now();
    while running(words) {
        if start.elapsed() > Duration::from_secs(5) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// Whether a process whose command line is `words` runs (a zombie does not count).
fn running(words: &[&str]) -> bool {
    let wanted: Vec<u8> = words
        .iter()
        .flat_map(|w| [w.as_bytes(), b"\0"].concat())
        .collect();
    fs::read_dir("/proc").unwrap().any(|e| {
        let Ok(e) = e else { return false };
        let zombie = fs::read_to_string(e.path().join("stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, r)| r.trim_start().starts_with('Z'))
        });
        !zombie && fs::read(e.path().join("cmdline")).is_ok_and(|c| c == wanted)
    })
}

/// A source that says nothing is stopped once `--source-timeout` has passed, with the
/// processes it started, and the next source repairs the file; SIGTERM ends a repair that
/// waits on a source, and its children, at once.
#[test]
fn a_silent_source_is_stopped_and_sigterm_ends_the_repair_with_its_children() {
    let t = Tree::new();
    let (name, good) = damaged(&t);
    let copy = t.path("copy");
    let silent = format!("sleep 297; cat {}/{{}}", copy.display());
    let right = format!("cat {}/{{}}", copy.display());
    let start = Instant::now();
    let r = cmd!(
        "repair",
        "--no-state",
        "--discard-damaged",
        "--source-timeout",
        "1s",
        "--from-command",
        &silent,
        "--from-command",
        &right,
        t.path("src")
    )
    .within(Duration::from_secs(60))
    .run()
    .expect_code(0);
    assert!(start.elapsed() < Duration::from_secs(30));
    assert_eq!(fs::read(&name).unwrap(), good);
    assert!(r.stdout.contains("said nothing for 1s"), "{}", r.stdout);
    assert!(
        !outlives(&["sleep", "297"]),
        "the silent source's child outlived it"
    );

    // SIGTERM while a source sleeps (the default timeout is minutes away).
    flip_byte(&name, 1000);
    let waiting = format!("sleep 298; cat {}/{{}}", copy.display());
    let mut child = cmd!(
        "repair",
        "--no-state",
        "--from-command",
        &waiting,
        t.path("src")
    )
    .command()
    .spawn()
    .unwrap();
    let start = Instant::now();
    while !running(&["sleep", "298"]) {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the source never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let asked = Instant::now();
    // SAFETY: a plain kill(2) of our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if asked.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("repair still running 10 s after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        asked.elapsed() < Duration::from_secs(3),
        "{:?}",
        asked.elapsed()
    );
    assert_ne!(code, Some(0));
    assert!(
        !outlives(&["sleep", "298"]),
        "the source outlived the repair"
    );
    assert_ne!(fs::read(&name).unwrap(), good);
}

/// borg with no passphrase would prompt on the terminal and wait for ever: run on a terminal
/// (`script` gives it one), the repair still ends at once, saying why the source could not
/// be used.
#[test]
fn a_tool_that_would_prompt_fails_at_once_even_on_a_terminal() {
    let t = Tree::new();
    let (name, _) = damaged(&t);
    let repo = t.path("borg-repo");
    let borg = |args: &[&OsStr]| {
        let out = Command::new("borg")
            .args(args)
            .env("BORG_PASSPHRASE", "correct horse")
            .env("BORG_BASE_DIR", t.path("borg-home"))
            .output()
            .expect("borg (borgbackup; .ci/run installs it)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    borg(&[
        "init".as_ref(),
        "-e".as_ref(),
        "repokey".as_ref(),
        repo.as_os_str(),
    ]);
    let archive = format!("{}::one", repo.display());
    borg(&[
        "create".as_ref(),
        archive.as_ref(),
        t.path("copy").as_os_str(),
    ]);
    let line = format!(
        "{} repair --no-state --from borg:{} {}",
        bin(),
        repo.display(),
        t.path("src").display()
    );
    let start = Instant::now();
    let mut child = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("BORG_BASE_DIR", t.path("borg-home"))
        .env_remove("BORG_PASSPHRASE")
        .env("XDG_STATE_HOME", t.path("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("repair waited on a passphrase prompt");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(status.code(), Some(1), "{said}");
    assert!(said.contains("passphrase"), "{said}");
    assert!(name.exists());
}

/// A `--from` that names nothing is a usage error before anything is checked.
#[test]
fn a_source_that_does_not_exist_is_a_usage_error() {
    let t = Tree::new();
    t.write("src/a", data(1000, 1));
    intact!("tag", "-q", t.path("src")).expect_code(0);
    let r = intact!("repair", "--from", t.path("nowhere"), t.path("src")).expect_code(2);
    assert!(r.stderr.contains("nowhere"), "{}", r.stderr);
}

//! A small harness: temp trees with real files and xattrs, and the real `intact` binary.
#![allow(dead_code)]
#![allow(unsafe_code)]

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

pub const ALGOS: [&str; 2] = ["sha256", "blake3"];
pub const TAG: &str = "user.intact";

/// A temporary directory tree, removed on drop.
pub struct Tree {
    dir: tempfile::TempDir,
}

impl Tree {
    pub fn new() -> Self {
        let dir = tempfile::Builder::new()
            .prefix("intact-test")
            .tempdir()
            .unwrap();
        Tree { dir }
    }

    pub fn root(&self) -> &Path {
        self.dir.path()
    }

    pub fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.root().join(rel)
    }

    /// Writes a file (creating parent directories) and returns its path.
    pub fn write(&self, rel: impl AsRef<Path>, data: impl AsRef<[u8]>) -> PathBuf {
        let p = self.path(rel);
        if let Some(parent) = p.parent() {
            fs::create_dir_all(parent).unwrap();
        }
        fs::write(&p, data).unwrap();
        p
    }

    /// Opens the tree to every user (for tests that run intact as `nobody`).
    pub fn open_to_all(&self) {
        fs::set_permissions(self.root(), fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// What one run of the binary did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics with the whole output unless the exit code is `code`.
    pub fn expect_code(self, code: i32) -> Self {
        assert_eq!(
            self.code, code,
            "exit code {} instead of {code}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }

    /// The JSON Lines output split into file objects and the summary.
    pub fn json(&self) -> Json {
        let mut files = Vec::new();
        let mut known = Vec::new();
        let mut summary = None;
        for line in self.stdout.lines() {
            let v: Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("bad JSON {line:?}: {e}"));
            match v["type"].as_str() {
                Some("file") => files.push(v),
                Some("damage" | "removed") => known.push(v),
                Some("summary") => {
                    assert!(summary.is_none(), "two summaries");
                    summary = Some(v)
                }
                other => panic!("unknown type {other:?}"),
            }
        }
        Json {
            files,
            known,
            summary: summary.expect("a summary object"),
        }
    }
}

pub struct Json {
    pub files: Vec<Value>,
    /// What the state database knew that the run did not see: `damage` and `removed`.
    pub known: Vec<Value>,
    pub summary: Value,
}

impl Json {
    /// The object for the file whose escaped path ends with `/suffix`.
    pub fn file(&self, suffix: &str) -> &Value {
        let hits: Vec<&Value> = self
            .files
            .iter()
            .filter(|f| f["path"].as_str().unwrap().ends_with(&format!("/{suffix}")))
            .collect();
        assert_eq!(hits.len(), 1, "{suffix}: {hits:?} in {:#?}", self.files);
        hits[0]
    }

    pub fn status(&self, suffix: &str) -> String {
        self.file(suffix)["status"].as_str().unwrap().to_string()
    }

    pub fn count(&self, status: &str) -> u64 {
        self.summary["counts"][status].as_u64().unwrap()
    }
}

/// Whether the program `tool` is on the PATH.
pub fn has(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_intact")
}

/// `intact ARGS...` to be run: as root or `nobody`, with a time limit, with extra environment.
pub struct Cmd {
    args: Vec<OsString>,
    nobody: bool,
    limit: Option<Duration>,
    env: Vec<(OsString, OsString)>,
    /// Resource limits set in the child before exec.
    limits: Vec<(libc::__rlimit_resource_t, u64)>,
    /// A file the child sees as /etc/fstab, in a mount namespace of its own.
    fstab: Option<std::ffi::CString>,
    /// The folder it runs in.
    dir: Option<PathBuf>,
}

impl Cmd {
    pub fn new(args: &[&OsStr]) -> Cmd {
        Cmd {
            args: args.iter().map(|a| a.to_os_string()).collect(),
            nobody: false,
            limit: None,
            env: Vec::new(),
            limits: Vec::new(),
            fstab: None,
            dir: None,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Self {
        self.args.push(arg.as_ref().to_os_string());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, args: I) -> Self {
        self.args
            .extend(args.into_iter().map(|a| a.as_ref().to_os_string()));
        self
    }

    /// Runs in `dir` (a PATH given relative to it).
    pub fn current_dir(mut self, dir: &Path) -> Self {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// Runs as the unprivileged user `nobody`.
    pub fn nobody(mut self) -> Self {
        self.nobody = true;
        self
    }

    /// Fails the test (and kills intact) if the run takes longer: a hang is a failure.
    pub fn within(mut self, limit: Duration) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Caps the data segment (heap and anonymous maps, RLIMIT_DATA) of the run: an
    /// allocation past it aborts intact, which the test then sees.
    pub fn memory_limit(mut self, bytes: u64) -> Self {
        self.limits.push((libc::RLIMIT_DATA, bytes));
        self
    }

    /// Caps the files the run may hold open (RLIMIT_NOFILE, soft and hard: intact cannot
    /// raise it).
    pub fn open_files(mut self, n: u64) -> Self {
        self.limits.push((libc::RLIMIT_NOFILE, n));
        self
    }

    /// Runs `days` days from now by the clock intact reads (libfaketime): what it tags now is
    /// then days old, as rot comes, and no file is within its racy window. Monotonic time is
    /// left real, so that timeouts still measure real time.
    pub fn days_later(self, days: u32) -> Self {
        self.env("LD_PRELOAD", faketime())
            .env("FAKETIME", format!("+{days}d"))
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1")
    }

    /// Runs with `file` as its /etc/fstab (root): bound over the machine's in a mount
    /// namespace of the run's own, which the machine never sees.
    pub fn fstab(mut self, file: &Path) -> Self {
        use std::os::unix::ffi::OsStrExt;
        self.fstab = Some(std::ffi::CString::new(file.as_os_str().as_bytes()).unwrap());
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Self {
        self.env
            .push((key.as_ref().to_os_string(), value.as_ref().to_os_string()));
        self
    }

    /// The process, not yet started, with stdout and stderr piped.
    pub fn command(&self) -> Command {
        let mut c = if self.nobody {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
                .arg(bin());
            c
        } else {
            Command::new(bin())
        };
        c.args(&self.args)
            .env("XDG_STATE_HOME", state_home(self.nobody))
            // The machine's damage index of the test's own (root's, which nobody reads too).
            .env(
                "INTACT_DAMAGE_INDEX",
                state_home(false).join("damage-index/index"),
            )
            .env_remove("INTACT_STATE")
            // Nobody is told of a test's findings unless the test says so.
            .env_remove("INTACT_NOTIFY")
            .env_remove("INTACT_NOTIFY_CONFIG")
            .env_remove("INTACT_HEARTBEAT")
            .env_remove("INTACT_REPAIR_FROM")
            .env_remove("INTACT_REMIND_EVERY")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(dir) = &self.dir {
            c.current_dir(dir);
        }
        if let Some(fstab) = self.fstab.clone() {
            use std::os::unix::process::CommandExt;
            // SAFETY: unshare and mount are plain system calls, on strings made before the
            // fork; they run in the child before exec.
            unsafe {
                c.pre_exec(move || {
                    let none = std::ptr::null();
                    let (root, etc) = (c"/".as_ptr(), c"/etc/fstab".as_ptr());
                    let private = libc::MS_REC | libc::MS_PRIVATE;
                    if libc::unshare(libc::CLONE_NEWNS) != 0
                        || libc::mount(none, root, none, private, std::ptr::null()) != 0
                        || libc::mount(fstab.as_ptr(), etc, none, libc::MS_BIND, none.cast()) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        if !self.limits.is_empty() {
            use std::os::unix::process::CommandExt;
            let limits = self.limits.clone();
            // SAFETY: setrlimit is async-signal-safe; it runs in the child before exec.
            unsafe {
                c.pre_exec(move || {
                    for &(resource, n) in &limits {
                        let limit = libc::rlimit {
                            rlim_cur: n,
                            rlim_max: n,
                        };
                        if libc::setrlimit(resource, &limit) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                    Ok(())
                });
            }
        }
        c
    }

    /// Runs it, and says its peak resident memory (KiB) and how long it took. The peak is its
    /// `VmHWM`, read as it runs: its `ru_maxrss` would be at least the test process's own
    /// (Linux keeps the high-water mark through fork and exec), which many tests at once
    /// make large.
    pub fn measure(self) -> (Run, u64, Duration) {
        let start = std::time::Instant::now();
        // Reaped by wait4 below, not by `Child::wait`.
        #[allow(clippy::zombie_processes)]
        let mut child = self.command().spawn().unwrap();
        let pid = child.id();
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let polled = {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut peak = 0u64;
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    let status = fs::read_to_string(format!("/proc/{pid}/status"));
                    let hwm = status.ok().and_then(|s| {
                        let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
                        line.split_whitespace().nth(1)?.parse::<u64>().ok()
                    });
                    peak = peak.max(hwm.unwrap_or(0));
                    std::thread::sleep(Duration::from_millis(2));
                }
                peak
            })
        };
        let read = |mut r: Box<dyn std::io::Read + Send>| {
            std::thread::spawn(move || {
                let mut s = Vec::new();
                let _ = r.read_to_end(&mut s);
                s
            })
        };
        let out = read(Box::new(child.stdout.take().unwrap()));
        let err = read(Box::new(child.stderr.take().unwrap()));
        let mut status = 0;
        // SAFETY: a zeroed rusage is a valid value for wait4 to fill.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: wait4 on our own child, with valid pointers to a status and a rusage.
        let r = unsafe { libc::wait4(pid as i32, &mut status, 0, &mut usage) };
        assert_eq!(r, pid as i32, "wait4: {}", std::io::Error::last_os_error());
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        // A run too short to be read as it ran: its ru_maxrss, an upper bound.
        let peak = match polled.join().unwrap() {
            0 => usage.ru_maxrss as u64,
            kib => kib,
        };
        let code = if libc::WIFEXITED(status) {
            libc::WEXITSTATUS(status)
        } else {
            -libc::WTERMSIG(status)
        };
        let run = Run {
            code,
            stdout: String::from_utf8_lossy(&out.join().unwrap()).into_owned(),
            stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
        };
        (run, peak, start.elapsed())
    }

    pub fn run(self) -> Run {
        let child = self.command().spawn().unwrap();
        let Some(limit) = self.limit else {
            return Run::from(child.wait_with_output().unwrap());
        };
        let id = child.id();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let out = child.wait_with_output().unwrap();
            let _ = done_tx.send(());
            out
        });
        let hung = done_rx.recv_timeout(limit).is_err();
        if hung {
            // SAFETY: a plain kill(2) of the child, still unreaped (the waiter reaps it).
            unsafe { libc::kill(id as i32, libc::SIGKILL) };
        }
        let run = Run::from(waiter.join().unwrap());
        assert!(
            !hung,
            "intact {:?} still running after {limit:?}: killed\n--- stdout\n{}--- stderr\n{}",
            self.args, run.stdout, run.stderr
        );
        run
    }
}

/// Runs what `cmd` makes and stops it with SIGTERM, later and later until `landed` says the
/// signal came mid-run (when it lands depends on the machine); that run.
pub fn terminated_mid_run(cmd: impl Fn() -> Cmd, landed: impl Fn(&Run) -> bool) -> Run {
    for delay in [100, 200, 400, 800, 1600, 3200] {
        let child = cmd().command().spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay));
        // SAFETY: kill(2) of our own unreaped child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let run = Run::from(child.wait_with_output().unwrap());
        if landed(&run) {
            return run;
        }
    }
    panic!("no signal landed mid-run");
}

/// libfaketime's library for threaded programs (Debian's `faketime`); a test that needs it
/// fails where it is missing (`.ci/run` installs it).
pub fn faketime() -> PathBuf {
    let found = fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("faketime/libfaketimeMT.so.1"))
        .find(|p| p.exists());
    found.expect("libfaketime is not installed (Debian's faketime package)")
}

/// Where runs keep their default state database: one per test and user, never the
/// machine's. (Tests share nothing through it: a damage one test records would be known to
/// another whose files reuse the inode numbers and the contents; sharing is tested apart.)
pub fn state_home(nobody: bool) -> PathBuf {
    // No test outlives its process: what earlier test processes left is removed, once.
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        for e in fs::read_dir(std::env::temp_dir())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name
                .strip_prefix("intact-test-state-")
                .and_then(|rest| rest.split('-').next()?.parse::<u32>().ok());
            if let Some(pid) = pid
                && !Path::new(&format!("/proc/{pid}")).exists()
            {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    });
    let test = std::thread::current()
        .name()
        .unwrap_or("main")
        .replace("::", "-");
    let dir = std::env::temp_dir().join(format!(
        "intact-test-state-{}-{test}-{}",
        std::process::id(),
        if nobody { "nobody" } else { "root" }
    ));
    if !dir.exists() {
        let _ = fs::create_dir_all(&dir);
        let _ = fs::set_permissions(&dir, fs::Permissions::from_mode(0o1777));
    }
    dir
}

/// `intact ARGS...`, not yet run (see [`Cmd`]); each argument anything that is `AsRef<OsStr>`.
#[macro_export]
macro_rules! cmd {
    () => {
        $crate::common::Cmd::new(&[])
    };
    ($($arg:expr),+ $(,)?) => {
        $crate::common::Cmd::new(&[$(::std::convert::AsRef::<::std::ffi::OsStr>::as_ref(&$arg)),*])
    };
}

/// Runs `intact ARGS...` and waits for it.
#[macro_export]
macro_rules! intact {
    ($($arg:expr),* $(,)?) => {
        $crate::cmd!($($arg),*).run()
    };
}

/// Runs `intact ARGS...` as the unprivileged user `nobody`.
#[macro_export]
macro_rules! intact_as_nobody {
    ($($arg:expr),* $(,)?) => {
        $crate::cmd!($($arg),*).nobody().run()
    };
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Tests that need root (mounts, other users) say so and pass vacuously elsewhere; under
/// `CI=true` a skip is a failure (CI runs as root, so they always run there).
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::common::is_root() {
            skip!("needs root");
        }
    };
}

/// The raw value of an extended attribute, if present.
pub fn getxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 65536];
    match rustix::fs::lgetxattr(path, name, &mut buf[..]) {
        Ok(n) => Some(buf[..n].to_vec()),
        Err(rustix::io::Errno::NODATA) => None,
        Err(e) => panic!("getxattr {}: {e}", path.display()),
    }
}

pub fn setxattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, rustix::fs::XattrFlags::empty()).unwrap();
}

/// The file's mtime as (seconds, nanoseconds).
pub fn mtime(path: &Path) -> (i64, i64) {
    let st = rustix::fs::stat(path).unwrap();
    (st.st_mtime, st.st_mtime_nsec as i64)
}

pub fn set_mtime(path: &Path, (sec, nsec): (i64, i64)) {
    let t = rustix::fs::Timestamps {
        last_access: rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        },
        last_modification: rustix::fs::Timespec {
            tv_sec: sec,
            tv_nsec: nsec as _,
        },
    };
    rustix::fs::utimensat(rustix::fs::CWD, path, &t, rustix::fs::AtFlags::empty()).unwrap();
}

/// Runs `change` on the file, then puts its mtime back: what bit rot looks like.
pub fn behind_the_back(path: &Path, change: impl FnOnce(&Path)) {
    let before = mtime(path);
    change(path);
    set_mtime(path, before);
    assert_eq!(mtime(path), before);
}

/// Flips one bit of the byte at `offset`, keeping the mtime.
pub fn flip_byte(path: &Path, offset: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    behind_the_back(path, |p| {
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(p)
            .unwrap();
        let mut b = [0u8];
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.read_exact(&mut b).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&[b[0] ^ 0x10]).unwrap();
    });
}

/// Deterministic pseudo-random bytes.
pub fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    fastrand::Rng::with_seed(seed).fill(&mut v);
    v
}

/// A mount point inside a tree, unmounted on drop.
pub struct Mount(pub PathBuf);

impl Mount {
    pub fn new(fstype: &str, options: &str, at: PathBuf) -> Self {
        fs::create_dir_all(&at).unwrap();
        let status = Command::new("mount")
            .args(["-t", fstype, "-o", options, "none"])
            .arg(&at)
            .status()
            .unwrap();
        assert!(status.success(), "mount -t {fstype} failed");
        Mount(at)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Temp files of intact's (`.intact-PID-N.tmp`) anywhere under `dir`: what a run left behind.
pub fn leftovers(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return found;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if e.file_type().unwrap().is_dir() {
            found.extend(leftovers(&e.path()));
        } else if name.starts_with(".intact-") && name.ends_with(".tmp") {
            found.push(e.path());
        }
    }
    found
}

/// intact's tag on `path`, decoded as the README documents version 2 (not by the library's
/// parser, so a change of layout shows here): algorithm, digest, size, mtime, tagging time.
#[derive(Debug)]
pub struct RawTag {
    pub algo: &'static str,
    pub digest: Vec<u8>,
    pub size: u64,
    pub mtime: (i64, u32),
    pub tagged: i64,
}

pub fn intact_tag(path: &Path) -> RawTag {
    let raw = getxattr(path, TAG).unwrap_or_else(|| panic!("{} has no tag", path.display()));
    assert_eq!(raw.len(), 62, "{}: {raw:?}", path.display());
    assert_eq!(raw[0], 2, "version");
    let int = |at: usize| i64::from_le_bytes(raw[at..at + 8].try_into().unwrap());
    RawTag {
        algo: match raw[1] {
            1 => "sha256",
            2 => "blake3",
            n => panic!("algorithm {n}"),
        },
        digest: raw[2..34].to_vec(),
        size: int(34) as u64,
        mtime: (int(42), u32::from_le_bytes(raw[50..54].try_into().unwrap())),
        tagged: int(54),
    }
}

/// The arguments a systemd unit's `ExecStart=` gives intact (after the binary), as systemd
/// would expand them on a test's tree: `$VAR` from the unit's `Environment="VAR=..."`
/// default, and each `(word or its start, what it stands for)` of `paths` (the state
/// database, `%f`, a metrics directory) in place of the machine's.
pub fn unit_command(unit: &str, paths: &[(&str, &Path)]) -> Vec<String> {
    let exec = unit
        .lines()
        .find(|l| l.starts_with("ExecStart="))
        .expect("an ExecStart");
    exec.trim_start_matches("ExecStart=")
        .split_whitespace()
        .skip(1)
        .flat_map(|word| {
            if let Some(var) = word.strip_prefix('$').filter(|v| !v.starts_with('{')) {
                let default = unit
                    .split(&format!("\"{var}="))
                    .nth(1)
                    .and_then(|rest| rest.split('"').next())
                    .unwrap_or_else(|| panic!("{var} has a default"));
                return default.split_whitespace().map(String::from).collect();
            }
            match paths.iter().find(|(w, _)| word.starts_with(w)) {
                Some((_, path)) => vec![path.display().to_string()],
                None => vec![word.to_string()],
            }
        })
        .collect()
}

/// The files the state database at `db` has entries for, by path, each with the page it is
/// in (decoded as intact packs them: a directory's entries in pages).
fn db_pages(db: &Path) -> Vec<(Vec<u8>, Vec<u8>, Vec<intact::state::entries::Entry>)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(
            "SELECT d.path, d.first, d.entries, p.run, p.at, p.archived_in, p.archived \
             FROM dirs d LEFT JOIN proven p ON p.path = d.path AND p.first = d.first",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, Vec<u8>>(0)?,
                r.get::<_, Vec<u8>>(1)?,
                r.get::<_, Vec<u8>>(2)?,
                intact::state::entries::Proof::read(r, 3)?,
            ))
        })
        .unwrap();
    let mut all = Vec::new();
    for row in rows {
        let (dir, first, value, proof) = row.unwrap();
        let mut entries = intact::state::entries::decode(&value).expect("entries that decode");
        if let Some(proof) = proof {
            proof.apply(&mut entries);
        }
        all.push((dir, first, entries));
    }
    all
}

/// The files the state database at `db` has entries for, by path.
pub fn db_entries(db: &Path) -> Vec<(Vec<u8>, intact::state::entries::Entry)> {
    let mut all = Vec::new();
    for (dir, _, entries) in db_pages(db) {
        for e in entries {
            all.push((intact::state::entries::join(&dir, &e.name), e));
        }
    }
    all
}

/// Changes every entry of the state database at `db` by `f` (what tests make of time).
pub fn db_change_entries(db: &Path, f: impl Fn(&mut intact::state::entries::Entry)) {
    let pages = db_pages(db);
    let conn = rusqlite::Connection::open(db).unwrap();
    // What a run proved of a page is in its entries now.
    conn.execute("DELETE FROM proven", []).unwrap();
    for (dir, first, mut entries) in pages {
        entries.iter_mut().for_each(&f);
        conn.execute(
            "UPDATE dirs SET entries = ?3 WHERE path = ?1 AND first = ?2",
            rusqlite::params![dir, first, intact::state::entries::encode(&entries)],
        )
        .unwrap();
    }
}

/// A copy of the tree `from` at `to` made with `cp -a` (xattrs, owners, modes, times and hard
/// links kept): a backup as people make one.
pub fn copy_tree(from: &Path, to: &Path) {
    let copied = std::process::Command::new("cp")
        .args(["-a", "--"])
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(
        copied.success(),
        "cp -a {} {}",
        from.display(),
        to.display()
    );
}

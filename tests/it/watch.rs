//! `intact watch`: the real service on real trees, with the kernel's real events (fanotify as
//! root, inotify as `nobody`), polled with generous limits.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;

/// A running `intact watch`, killed when dropped.
pub struct Watch {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Watch {
    /// Starts `intact watch --settle 1s ARGS...` (as `nobody`: inotify) and waits until it
    /// watches.
    fn start(args: &[&std::ffi::OsStr], nobody: bool) -> Watch {
        Watch::settling("1s", args, nobody)
    }

    fn settling(settle: &str, args: &[&std::ffi::OsStr], nobody: bool) -> Watch {
        let mut cmd = Cmd::new(&[]).args(["watch", "--settle", settle]).args(args);
        if nobody {
            cmd = cmd.nobody();
        }
        Watch::spawn(cmd)
    }

    /// Starts `cmd` (an `intact watch ...`) and waits until it watches.
    pub fn spawn(cmd: Cmd) -> Watch {
        let mut child = cmd.command().spawn().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let w = Watch { child, log };
        w.until("it watches", || w.log().contains("intact: watching"));
        w
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits (at most a minute) until `done`.
    pub fn until(&self, what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        while !done() {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "not {what} after a minute; the service said:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self, signal: rustix::process::Signal) -> i32 {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, signal).unwrap();
        let status = self.child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        status.code().unwrap_or(128 + status.signal().unwrap_or(0))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Everything under `dir` readable and writable by every user (for the service as `nobody`).
fn open_to_everyone(dir: &Path) {
    let ok = std::process::Command::new("chmod")
        .args(["-R", "a+rwX"])
        .arg(dir)
        .status()
        .unwrap()
        .success();
    assert!(ok);
}

pub fn tagged(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok() && getxattr(path, TAG).is_some()
}

/// A file written under the tree: the data, written through one open file (each write an
/// event), as a program writes it.
fn write_slowly(path: &Path, parts: &[&[u8]]) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    for part in parts {
        f.write_all(part).unwrap();
        f.flush().unwrap();
    }
}

/// New files are tagged seconds after they are written: in a folder watched from the start,
/// in folders made since (nested), moved in from outside the tree; an edited file is
/// re-tagged; `status` says the tree is watched while it is, and not once the service is
/// killed. As root (fanotify on the whole file system) and as a user (inotify).
/// The service holds its secrets (notification tokens, repository passwords) for days: it
/// can leave no core file, whatever limit it was started with.
#[test]
fn the_service_can_dump_no_core() {
    let t = Tree::new();
    t.write("tree/a", data(100, 1));
    let w = Watch::start(&[t.path("tree").as_os_str()], false);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", w.child.id())).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .expect("a core limit");
    let soft_hard: Vec<&str> = core.split_whitespace().skip(4).take(2).collect();
    assert_eq!(soft_hard, ["0", "0"], "{core}");
    // The loop that records writes keeps the priority it was started with (its runs step
    // back on threads of their own): field 19 of stat, after the name, is the nice value.
    let nice = |pid: &str| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<String> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .map(String::from)
            .collect();
        fields[16].clone()
    };
    assert_eq!(
        nice(&w.child.id().to_string()),
        nice("self"),
        "the watch's loop is not lowered"
    );
}

#[test]
fn files_are_tagged_seconds_after_they_are_written() {
    for nobody in [false, true] {
        if !nobody {
            require_root!();
        }
        let t = Tree::new();
        let tree = t.path("tree");
        let outside = t.path("outside");
        std::fs::create_dir_all(tree.join("old")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let edited = t.write("tree/old/edited.txt", b"first version");
        intact!["tag", &tree].expect_code(0);
        let before = intact_tag(&edited);
        if nobody {
            open_to_everyone(t.root());
        }
        let mut w = Watch::start(&[tree.as_os_str()], nobody);
        let how = if nobody { "inotify" } else { "fanotify" };
        assert!(w.log().contains(how), "{}", w.log());
        let status = cmd!["status", &tree];
        let status = if nobody { status.nobody() } else { status }.run();
        assert!(
            status.stdout.contains("watched     since"),
            "{}",
            status.stdout
        );

        let fresh = tree.join("old/new.bin");
        write_slowly(&fresh, &[&data(100_000, 1), &data(100_000, 2)]);
        std::fs::create_dir_all(tree.join("a/b/c")).unwrap();
        let deep = tree.join("a/b/c/deep.txt");
        std::fs::write(&deep, b"deep").unwrap();
        let moved = outside.join("moved.txt");
        std::fs::write(&moved, b"moved in").unwrap();
        if nobody {
            open_to_everyone(t.root());
        }
        std::fs::rename(&moved, tree.join("old/moved.txt")).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        std::fs::write(&edited, b"second version, longer").unwrap();
        let files = [fresh.clone(), deep.clone(), tree.join("old/moved.txt")];
        w.until("tagged", || files.iter().all(|f| tagged(f)));
        w.until("re-tagged", || intact_tag(&edited).digest != before.digest);
        let check = cmd!["check", &tree];
        let check = if nobody { check.nobody() } else { check }.run();
        assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
        assert!(check.stderr.contains("4 ok"), "{}", check.stderr);
        w.until("said so", || w.log().contains("modified "));
        w.kill(rustix::process::Signal::KILL);
        let status = cmd!["status", &tree];
        let status = if nobody { status.nobody() } else { status }.run();
        assert!(
            status.stdout.contains("watched     no"),
            "{}",
            status.stdout
        );
    }
}

/// The exiftool case: a program rewrites a tagged photo and puts its old mtime back. Without
/// the service that is damage for `check` (the control); with it, the write it saw makes it
/// an edit, re-tagged and said so; and bit rot of the re-tagged file afterwards is damage
/// again (the write is forgotten once tagged).
#[test]
fn a_write_that_puts_the_old_mtime_back_is_an_edit() {
    require_root!();
    let t = Tree::new();
    let tree = t.path("tree");
    let control = t.path("control");
    for dir in [&tree, &control] {
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("photo.png"), png()).unwrap();
        // exiftool -P restores the mtime to the second.
        set_mtime(&dir.join("photo.png"), (1_700_000_000, 0));
        // ... so an mtime with a fraction comes back set back to its whole second.
        std::fs::write(dir.join("fraction.png"), png()).unwrap();
        set_mtime(&dir.join("fraction.png"), (1_700_000_000, 500_000_000));
    }
    intact!["tag", &tree, &control].expect_code(0);
    // The write comes in a later second than the tag (tags say when to the second).
    std::thread::sleep(Duration::from_millis(1100));
    let exiftool = |photo: &Path| {
        let ok = std::process::Command::new("exiftool")
            .args(["-q", "-P", "-overwrite_original_in_place", "-Title=Sunset"])
            .arg(photo)
            .status()
            .expect("exiftool (libimage-exiftool-perl) is installed")
            .success();
        assert!(ok);
        assert_eq!(
            mtime(photo),
            (1_700_000_000, 0),
            "exiftool -P kept the mtime"
        );
    };
    exiftool(&control.join("photo.png"));
    exiftool(&control.join("fraction.png"));
    let check = intact!["check", &control].expect_code(1);
    assert!(check.stdout.contains("corrupt  "), "{}", check.stdout);
    assert!(check.stdout.contains("older    "), "{}", check.stdout);

    let photo = tree.join("photo.png");
    let before = intact_tag(&photo);
    let w = Watch::start(&[tree.as_os_str()], false);
    exiftool(&photo);
    w.until("re-tagged", || intact_tag(&photo).digest != before.digest);
    w.until("said so", || w.log().contains("intact watch saw the write"));
    assert!(w.log().contains("modified "), "{}", w.log());
    assert!(!w.log().contains("corrupt"), "{}", w.log());
    // The edit that set the mtime back to its second reads as that, not as an older copy.
    let fraction = tree.join("fraction.png");
    let before = intact_tag(&fraction);
    exiftool(&fraction);
    w.until("re-tagged", || {
        intact_tag(&fraction).digest != before.digest
    });
    w.until("said so", || {
        w.log().contains("fraction.png: mtime set back: written at")
    });
    assert!(
        !w.log().lines().any(|l| l.starts_with("older")),
        "{}",
        w.log()
    );
    intact!["check", &tree].expect_code(0);
    drop(w);
    // Rot after the edit is damage: the write seen was before the new tag.
    flip_byte(&photo, 40);
    let check = intact!["check", &tree].expect_code(1);
    assert!(check.stdout.contains("corrupt  "), "{}", check.stdout);
}

/// A watched tree unmounted or removed is said, and the service exits non-zero (the unit's
/// `Restart=` brings it back with the tree); an idle watch holds nothing in the tree, so
/// `umount` is not refused as busy.
#[test]
fn a_watched_tree_unmounted_or_removed_stops_the_watch_loudly() {
    crate::require_faults!();
    let t = Tree::new();
    let disk = crate::faultfs::LoopFs::ext4(t.root(), 32, &[]);
    let plain = t.path("plain");
    std::fs::create_dir_all(&plain).unwrap();
    for (tree, gone) in [(&disk.root, "unmounted"), (&plain, "removed")] {
        std::fs::write(tree.join("photo"), b"a photo").unwrap();
        let db = t.path(format!("{gone}.db"));
        let mut w = Watch::spawn(
            Cmd::new(&[])
                .args(["watch", "--settle", "1s", "--state"])
                .arg(&db)
                .arg(tree),
        );
        w.until("it tagged", || tagged(&tree.join("photo")));
        assert!(w.log().contains("fanotify"), "{}", w.log());
        if gone == "unmounted" {
            // Idle: what it read is read, no run holds the tree.
            std::thread::sleep(Duration::from_millis(1500));
            let um = std::process::Command::new("umount")
                .arg(tree)
                .output()
                .unwrap();
            assert!(um.status.success(), "umount refused: {um:?}\n{}", w.log());
        } else {
            std::fs::remove_dir_all(tree).unwrap();
        }
        let start = Instant::now();
        let code = loop {
            if let Some(status) = w.child.try_wait().unwrap() {
                break status.code();
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{gone}: still watching\n{}",
                w.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(code, Some(3), "{gone}: {}", w.log());
        w.until("said so", || {
            w.log()
                .contains("is gone (unmounted, removed, or moved or renamed)")
        });
    }
}

/// A PNG of 16 x 16 pixels (exiftool writes only into a file it can parse).
fn png() -> Vec<u8> {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import zlib,struct,sys
def chunk(t,d): return struct.pack('>I',len(d))+t+d+struct.pack('>I',zlib.crc32(t+d)&0xffffffff)
raw=b''.join(b'\\x00'+bytes([x%256,(x*3)%256,(x*7)%256])*16 for x in range(16))
sys.stdout.buffer.write(b'\\x89PNG\\r\\n\\x1a\\n'+chunk(b'IHDR',struct.pack('>IIBBBBB',16,16,8,2,0,0,0))+chunk(b'IDAT',zlib.compress(raw))+chunk(b'IEND',b''))",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    out.stdout
}

/// What the service saw outlives it: killed before it tagged a file it saw written (a long
/// settle), the write is in the state database, and a later `check` calls the change an edit
/// (exit 0), `update` re-tags it. The same change with no write seen is damage.
#[test]
fn a_write_seen_is_known_to_a_later_check() {
    require_root!();
    let t = Tree::new();
    let tree = t.path("tree");
    let seen = t.write("tree/seen.txt", b"before the write");
    let unseen = t.write("tree/unseen.txt", b"before the rot!!");
    intact!["tag", &tree].expect_code(0);
    let db = t.path("state.db");
    // The write comes in a later second than the tag (tags say when to the second).
    std::thread::sleep(Duration::from_millis(1100));
    let mut w = Watch::settling(
        "1h",
        &[tree.as_os_str(), "--state".as_ref(), db.as_os_str()],
        false,
    );
    behind_the_back(&seen, |p| std::fs::write(p, b"after the write!").unwrap());
    w.until("the write is recorded", || {
        db.exists()
            && rusqlite::Connection::open(&db)
                .and_then(|c| {
                    c.query_row("SELECT count(*) FROM written", [], |r| r.get::<_, i64>(0))
                })
                .unwrap_or(0)
                == 1
    });
    w.kill(rustix::process::Signal::KILL);
    flip_byte(&unseen, 3);
    let check = intact!["check", &tree, "--state", &db].expect_code(1);
    assert!(check.stdout.contains("corrupt  "), "{}", check.stdout);
    assert!(check.stdout.contains("unseen.txt"), "{}", check.stdout);
    let json = intact!["check", &tree, "--state", &db, "--json"].json();
    assert_eq!(json.status("seen.txt"), "modified");
    assert_eq!(json.status("unseen.txt"), "corrupt");
    intact!["update", &tree, "--state", &db].expect_code(1);
    assert_eq!(
        intact_tag(&seen).digest,
        {
            use sha2::Digest;
            sha2::Sha256::digest(b"after the write!").to_vec()
        },
        "re-tagged as an edit"
    );
}

/// A file found damaged stays damage when a program writes the same damaged bytes again under
/// the old mtime: a write seen ends damage only when it brings other bytes.
#[test]
fn damaged_bytes_written_again_stay_damage() {
    require_root!();
    let t = Tree::new();
    let tree = t.path("tree");
    let f = t.write("tree/f.bin", data(10_000, 7));
    intact!["tag", &tree].expect_code(0);
    flip_byte(&f, 100);
    intact!["check", &tree].expect_code(1);
    let before = intact_tag(&f);
    let w = Watch::start(&[tree.as_os_str()], false);
    let damaged = std::fs::read(&f).unwrap();
    behind_the_back(&f, |p| std::fs::write(p, &damaged).unwrap());
    w.until("looked at", || w.log().contains("corrupt  "));
    assert_eq!(intact_tag(&f).digest, before.digest, "damage blessed");
    drop(w);
    intact!["check", &tree].expect_code(1);
}

/// Events lost to a full queue (inotify's max_queued_events made tiny) make the service look
/// at the whole tree again: every file of a burst is tagged all the same.
#[test]
fn lost_events_miss_nothing() {
    require_root!();
    let knob = Path::new("/proc/sys/fs/inotify/max_queued_events");
    let old = std::fs::read_to_string(knob).unwrap();
    struct Restore<'a>(&'a Path, String);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            std::fs::write(self.0, self.1.trim()).unwrap();
        }
    }
    let _restore = Restore(knob, old);
    std::fs::write(knob, "16").unwrap();
    let t = Tree::new();
    let tree = t.path("tree");
    std::fs::create_dir_all(&tree).unwrap();
    open_to_everyone(t.root());
    // The queue's size is read when the service starts its inotify instance.
    let w = Watch::start(&[tree.as_os_str()], true);
    let files: Vec<PathBuf> = (0..300).map(|i| tree.join(format!("f{i:03}"))).collect();
    for (i, f) in files.iter().enumerate() {
        std::fs::write(f, data(1000, i as u64)).unwrap();
    }
    open_to_everyone(&tree);
    w.until("every file tagged", || files.iter().all(|f| tagged(f)));
}

/// Killed mid-burst, then started again: what it had not tagged yet is found at start.
#[test]
fn a_service_killed_mid_burst_tags_everything_once_restarted() {
    require_root!();
    let t = Tree::new();
    let tree = t.path("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let mut w = Watch::start(&[tree.as_os_str()], false);
    let files: Vec<PathBuf> = (0..2000)
        .map(|i| tree.join(format!("d{}/f{i:04}", i % 20)))
        .collect();
    for (i, f) in files.iter().enumerate() {
        if i % 100 == 0 {
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        }
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, data(2000, i as u64)).unwrap();
        if i == 1000 {
            std::thread::sleep(Duration::from_millis(1500));
        }
    }
    w.until("some tagged", || files.iter().any(|f| tagged(f)));
    w.kill(rustix::process::Signal::KILL);
    let left = files.iter().filter(|f| !tagged(f)).count();
    assert!(left > 0, "all tagged before the kill: nothing tested");
    let w = Watch::start(&[tree.as_os_str()], false);
    w.until("every file tagged", || files.iter().all(|f| tagged(f)));
    intact!["check", &tree].expect_code(0);
}

/// Excludes and `.intactignore` are honoured; a state database kept inside the tree is never
/// watched into a loop (its writes make no run after run).
#[test]
fn excludes_and_own_files_are_left_alone() {
    require_root!();
    // As root its own writes raise no event it takes (fanotify says who wrote); inotify
    // does not say: there its own files are told apart by name.
    for nobody in [false, true] {
        let t = Tree::new();
        let tree = t.path("tree");
        std::fs::create_dir_all(tree.join("cache")).unwrap();
        std::fs::create_dir_all(tree.join("state")).unwrap();
        std::fs::write(tree.join(".intactignore"), "cache/\n").unwrap();
        open_to_everyone(t.root());
        // The state folder is the runner's alone: one others can write is refused.
        let uid = if nobody { 65534 } else { 0 };
        std::os::unix::fs::chown(tree.join("state"), Some(uid), None).unwrap();
        std::fs::set_permissions(
            tree.join("state"),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let db = tree.join("state/state.db");
        let w = Watch::start(
            &[
                tree.as_os_str(),
                "--exclude".as_ref(),
                "*.part".as_ref(),
                "--state".as_ref(),
                db.as_os_str(),
            ],
            nobody,
        );
        let kept = t.write("tree/kept.txt", b"kept");
        let cached = t.write("tree/cache/c.txt", b"cached");
        let part = t.write("tree/big.part", b"partial download");
        for written in [&kept, &cached, &part] {
            open_to_everyone(written);
        }
        w.until("tagged", || tagged(&kept));
        // Its own writes (the state database's) would start run after run, a second or two
        // apart: it goes quiet (a write seen while a run read the file is one look more).
        let runs = || w.log().matches("watch: ").count();
        let (mut last, mut since) = (runs(), Instant::now());
        w.until("quiet for 5 s", || {
            if runs() != last {
                (last, since) = (runs(), Instant::now());
            }
            since.elapsed() >= Duration::from_secs(5)
        });
        std::thread::sleep(Duration::from_secs(5));
        assert_eq!(runs(), last, "runs keep coming: {}", w.log());
        assert!(!tagged(&cached) && !tagged(&part));
        for own in std::fs::read_dir(db.parent().unwrap()).unwrap() {
            assert!(!tagged(&own.unwrap().path()));
        }
    }
}

/// The unit's command line, as systemd runs it (`Type=notify`): the service says READY=1 on
/// the socket systemd names, once it watches, and tags what is written after.
#[test]
fn the_service_says_it_is_ready_as_its_unit_expects() {
    require_root!();
    let unit = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contrib/systemd/intact-watch@.service"),
    )
    .unwrap();
    assert!(unit.contains("Type=notify"));
    let t = Tree::new();
    let tree = t.path("tree");
    std::fs::create_dir_all(&tree).unwrap();
    let args = unit_command(
        &unit,
        &[
            ("/var/lib/intact/state.db", &t.path("state.db")),
            ("%f", &tree),
        ],
    );
    assert!(args.contains(&"--settle".to_string()), "{args:?}");
    let socket_path = t.path("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&socket_path).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut child = Cmd::new(&[])
        .args(&args)
        .env("NOTIFY_SOCKET", &socket_path)
        .command()
        .spawn()
        .unwrap();
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("READY=1 within a minute");
    assert_eq!(&buf[..n], b"READY=1");
    let f = t.write("tree/new.txt", b"written after ready");
    let start = Instant::now();
    while !tagged(&f) {
        assert!(start.elapsed() < Duration::from_secs(60), "not tagged");
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A user's inotify watches are capped by the kernel (`max_user_watches`): a tree with more
/// folders than that is not watched with holes: the service says why and does not start.
#[test]
fn too_few_inotify_watches_is_an_error_not_a_hole() {
    require_root!();
    let knob = Path::new("/proc/sys/fs/inotify/max_user_watches");
    let old = std::fs::read_to_string(knob).unwrap();
    struct Restore<'a>(&'a Path, String);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            std::fs::write(self.0, self.1.trim()).unwrap();
        }
    }
    let t = Tree::new();
    let tree = t.path("tree");
    for i in 0..40 {
        std::fs::create_dir_all(tree.join(format!("d{i}"))).unwrap();
    }
    open_to_everyone(t.root());
    let _restore = Restore(knob, old);
    std::fs::write(knob, "20").unwrap();
    let run = cmd!["watch", &tree]
        .nobody()
        .within(Duration::from_secs(60))
        .run();
    assert_eq!(run.code, 3, "{}{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("max_user_watches = 20") && run.stderr.contains("is not watched"),
        "{}",
        run.stderr
    );
}

/// A file system mounted beneath the tree is watched too (fanotify marks it as well; without
/// `-x` the walk enters it): a file written there is tagged.
#[test]
fn a_file_system_mounted_beneath_is_watched_too() {
    require_root!();
    let t = Tree::new();
    let tree = t.path("tree");
    let _mount = Mount::new("tmpfs", "size=8m", tree.join("mnt"));
    let w = Watch::start(&[tree.as_os_str()], false);
    assert!(w.log().contains("2 file system(s)"), "{}", w.log());
    let f = t.write("tree/mnt/sub/f.txt", b"on the mounted file system");
    w.until("tagged", || tagged(&f));
}

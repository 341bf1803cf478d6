//! Nothing outside the named trees is ever read, tagged, listed or archived, whatever a
//! manifest says or a concurrent rename does; and hostile input costs bounded memory.

use std::fs;
use std::os::unix::fs::{FileTypeExt, PermissionsExt, symlink};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sha2::Digest as _;

use crate::common::*;

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(sha2::Sha256::digest(data))
}

#[test]
fn import_opens_nothing_outside_its_dir() {
    let t = Tree::new();
    let inside = t.write("dir/inside", b"inside");
    let outside = t.write("outside/x", b"outside");
    t.write("dir/sub/y", b"y");
    symlink(t.path("outside"), t.path("dir/link")).unwrap();
    let (ok, out) = (sha256_hex(b"inside"), sha256_hex(b"outside"));
    let manifest = t.write(
        "dir/SHA256SUMS",
        format!(
            "{ok}  inside\n{out}  ../outside/x\n{out}  {}\n{out}  sub/../../outside/x\n\
             {out}  link/x\n",
            outside.display()
        ),
    );
    let r = intact!("import", "--json", &manifest, t.path("dir")).expect_code(3);
    assert_eq!(
        getxattr(&outside, TAG),
        None,
        "a file outside DIR was tagged"
    );
    assert!(getxattr(&inside, TAG).is_some());
    for line in [2, 3, 4] {
        assert!(
            r.stderr.contains(&format!("line {line}: ")) && r.stderr.contains("not followed"),
            "line {line}: {}",
            r.stderr
        );
    }
    // Through a symlink in the tree: refused, not followed.
    let j = r.json();
    assert_eq!(j.status("link/x"), "error", "{:?}", j.files);
    assert_eq!(j.files.len(), 2, "{:?}", j.files);
}

#[test]
fn a_manifest_line_longer_than_any_name_costs_no_memory() {
    let t = Tree::new();
    let f = t.write("dir/f", b"data");
    let mut text = format!("{}  f\n{}  ", sha256_hex(b"data"), sha256_hex(b"x")).into_bytes();
    text.resize(text.len() + (100 << 20), b'n');
    text.push(b'\n');
    let manifest = t.write("SUMS", text);
    // Before, the whole manifest was read into memory and the line copied several times.
    for verb in [&["import"][..], &["check", "--manifest"]] {
        let r = cmd!()
            .args(verb)
            .arg(&manifest)
            .arg(t.path("dir"))
            .memory_limit(64 << 20)
            .run()
            .expect_code(3);
        assert!(r.stderr.contains("line 2: longer than"), "{}", r.stderr);
    }
    assert!(getxattr(&f, TAG).is_some());
}

#[test]
fn a_directory_swapped_for_a_symlink_mid_run_never_leads_outside() {
    let t = Tree::new();
    for i in 0..40 {
        t.write(format!("tree/d/sub{i}/file"), data(100, i));
        t.write(format!("outside/sub{i}/OUTSIDE-{i}"), b"secret");
        symlink(
            "/etc/passwd",
            t.path(format!("outside/sub{i}/OUTSIDE-link")),
        )
        .unwrap();
    }
    symlink(t.path("outside"), t.path("tree/s")).unwrap();
    let stop = AtomicBool::new(false);
    /// Stops the swapping when the test ends, also by a failed assertion (the scope would
    /// otherwise wait for the swapper forever).
    struct Stop<'a>(&'a AtomicBool);
    impl Drop for Stop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                let _ = rustix::fs::renameat_with(
                    rustix::fs::CWD,
                    t.path("tree/d"),
                    rustix::fs::CWD,
                    t.path("tree/s"),
                    rustix::fs::RenameFlags::EXCHANGE,
                );
            }
        });
        let _stop = Stop(&stop);
        for round in 0..30 {
            let r = intact!("show", "-v", t.path("tree"));
            assert!(!r.stdout.contains("OUTSIDE"), "round {round}: {}", r.stdout);
            let archive = t.path(format!("a{round}.tar.zst"));
            intact!("archive", "create", "--untagged", &archive, t.path("tree"));
            if archive.exists() {
                let listed = intact!("archive", "list", &archive).stdout;
                assert!(!listed.contains("OUTSIDE"), "round {round}: {listed}");
            }
        }
    });
}

/// A FIFO named like a parity set (a pack's index and volume, a file's own set), planted by
/// a user who can write the store, stops no run of root's: `status`, `protect`, `check` and
/// `repair` read only regular files there (opened without blocking, refused unless `fstat`
/// says regular), finish within their limit, and the repair still restores the damage.
#[test]
fn a_fifo_named_like_a_parity_set_hangs_no_run() {
    require_root!();
    let t = Tree::new();
    for i in 0..20 {
        t.write(format!("tree/f{i:02}"), data(4000, i));
    }
    t.write("tree/big", data(300_000, 99));
    let root = t.path("tree");
    intact!("tag", "-q", &root).expect_code(0);
    intact!("protect", "-q", &root).expect_code(0);
    let store = root.join(".intact-parity");
    let own = std::fs::read_dir(&store)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("sha256-")
        })
        .expect("the large file's own set");
    let ff = "f".repeat(32);
    let fifos = [
        store.join(format!("packs/{ff}.par2")),
        store.join(format!("packs/{ff}.vol00+01.par2")),
        own.join(format!("{}.par2", "f".repeat(64))),
    ];
    for fifo in &fifos {
        let dir = fifo.parent().unwrap();
        fs::set_permissions(dir, fs::Permissions::from_mode(0o777)).unwrap();
        let made = Command::new("setpriv")
            .args([
                "--reuid=nobody",
                "--regid=nogroup",
                "--clear-groups",
                "mkfifo",
            ])
            .arg(fifo)
            .status()
            .unwrap();
        assert!(made.success(), "mkfifo as nobody");
    }
    flip_byte(&root.join("f03"), 100);
    let limit = Duration::from_secs(60);
    for verb in ["status", "check", "protect"] {
        let r = cmd!(verb, &root).within(limit).run();
        assert!(r.code >= 0, "{verb}: killed ({})", r.code);
    }
    cmd!("repair", &root).within(limit).run().expect_code(0);
    assert_eq!(fs::read(root.join("f03")).unwrap(), data(4000, 3));
    for fifo in &fifos {
        assert!(fs::symlink_metadata(fifo).unwrap().file_type().is_fifo());
    }
}

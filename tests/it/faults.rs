//! Faults: each gets a clear message naming the file and the cause, the run goes on over the
//! other files, nothing is left half-written, and the exit code says so.

#![allow(unsafe_code)]

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::common::*;

#[test]
fn no_xattr_support_is_a_clear_error_and_the_run_goes_on() {
    require_root!();
    let t = Tree::new();
    t.write("a-normal.txt", b"ext4");
    let m = Mount::new("ramfs", "mode=755", t.path("ram"));
    fs::write(m.0.join("file.txt"), b"ramfs has no user xattrs").unwrap();
    t.write("z-normal.txt", b"ext4 too");

    let r = intact!("tag", t.root()).expect_code(3);
    assert!(
        r.stdout.contains(&format!(
            "{}: cannot write tag: the file system does not support user extended attributes",
            m.0.join("file.txt").display()
        )),
        "{}",
        r.stdout
    );
    assert!(getxattr(&t.path("a-normal.txt"), TAG).is_some());
    assert!(getxattr(&t.path("z-normal.txt"), TAG).is_some());
    let j = intact!("update", "--json", t.root()).expect_code(3).json();
    assert_eq!(j.file("file.txt")["error_kind"], "no-xattr-support");
    assert_eq!(j.count("error"), 1);
}

#[test]
fn a_corrupt_file_whose_retag_fails_is_still_reported_corrupt() {
    require_root!();
    let t = Tree::new();
    t.open_to_all();
    let p = t.write("rotten", b"original bytes");
    rustix::fs::chown(&p, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
    intact!("tag", p).expect_code(0);
    flip_byte(&p, 3);
    fs::set_permissions(&p, fs::Permissions::from_mode(0o444)).unwrap();
    // nobody owns the file but may not write its xattrs: the accepted re-tag fails.
    let r = intact_as_nobody!("update", "--accept-corrupt", "--json", p);
    let j = r.expect_code(1).json();
    assert_eq!(j.status("rotten"), "corrupt");
    assert_eq!(j.file("rotten")["error_kind"], "permission-denied");
}

#[test]
fn unreadable_and_read_only_files_as_a_normal_user() {
    require_root!();
    let t = Tree::new();
    t.open_to_all();
    let secret = t.write("secret", b"root only");
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let readonly = t.write("readonly", b"cannot take a tag");
    fs::set_permissions(&readonly, fs::Permissions::from_mode(0o444)).unwrap();
    rustix::fs::chown(&readonly, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();
    let fine = t.write("fine", b"readable");
    fs::set_permissions(&fine, fs::Permissions::from_mode(0o666)).unwrap();
    rustix::fs::chown(&fine, Some(rustix::process::Uid::from_raw(65534)), None).unwrap();

    let r = intact_as_nobody!("tag", t.root()).expect_code(3);
    assert!(
        r.stdout.contains(&format!(
            "error    {}: cannot open: Permission denied",
            secret.display()
        )),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(&format!(
            "error    {}: cannot write tag: Permission denied",
            readonly.display()
        )),
        "{}",
        r.stdout
    );
    assert!(
        getxattr(&fine, TAG).is_some(),
        "the other file was not tagged"
    );
    assert!(getxattr(&readonly, TAG).is_none());

    // check as nobody: the unreadable file is an error, the readable ones are verified.
    intact!("tag", t.root()).expect_code(0);
    let j = intact_as_nobody!("check", "--json", t.root())
        .expect_code(3)
        .json();
    assert_eq!(j.status("secret"), "error");
    assert_eq!(j.file("secret")["error_kind"], "permission-denied");
    assert_eq!(j.status("readonly"), "ok");
    assert_eq!(j.status("fine"), "ok");
}

#[test]
fn a_file_growing_while_hashed_is_never_tagged() {
    for algo in ALGOS {
        let t = Tree::new();
        let p = t.write("growing.log", data(64 << 20, 4));
        let stop = AtomicBool::new(false);
        let run = std::thread::scope(|s| {
            s.spawn(|| {
                let mut f = fs::OpenOptions::new().append(true).open(&p).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    f.write_all(b"x").unwrap();
                    std::thread::sleep(Duration::from_micros(200));
                }
            });
            std::thread::sleep(Duration::from_millis(20));
            let r = intact!("tag", "--algo", algo, "--json", t.root());
            stop.store(true, Ordering::Relaxed);
            r
        });
        let j = run.expect_code(3).json();
        assert_eq!(j.status("growing.log"), "changed-while-read");
        assert!(
            j.file("growing.log")["detail"]
                .as_str()
                .unwrap()
                .contains("while being read")
        );
        assert!(
            getxattr(&p, TAG).is_none(),
            "a digest of a moving file was stored"
        );
    }
}

#[test]
fn a_file_truncated_while_hashed_is_never_tagged_and_nothing_crashes() {
    // Large files are hashed through memory maps: b3sum dies of SIGBUS when a mapped file
    // shrinks; intact must notice instead.
    for algo in ALGOS {
        let t = Tree::new();
        let p = t.path("shrinking");
        fs::File::create(&p).unwrap().set_len(4 << 30).unwrap();
        // Quiet for longer than a timestamp tick, so the read starts at once...
        std::thread::sleep(Duration::from_millis(50));
        let child = Cmd::new(&[])
            .command()
            .args([
                "tag".as_ref(),
                "--algo".as_ref(),
                algo.as_ref(),
                "--json".as_ref(),
                p.as_os_str(),
            ])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // ... and the file shrinks while it is being read (4 GiB take longer than this).
        std::thread::sleep(Duration::from_millis(150));
        fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(3), "{algo}: {:?}", out.status);
        let stdout = String::from_utf8(out.stdout).unwrap();
        let file: serde_json::Value = serde_json::from_str(stdout.lines().next().unwrap()).unwrap();
        assert_eq!(file["status"], "changed-while-read", "{algo}");
        assert!(
            getxattr(&p, TAG).is_none(),
            "a digest of a moving file was stored"
        );
    }
}

#[test]
fn full_xattr_space_is_reported() {
    let t = Tree::new();
    let p = t.write("crowded", b"data");
    // ext4 keeps a file's xattrs in its inode plus one block: fill that up, to the last few
    // bytes (a tag is small).
    let mut filled = false;
    let mut i = 0;
    for len in [200, 40, 8, 1] {
        for _ in 0..1000 {
            i += 1;
            let name = format!("user.p{i}");
            if rustix::fs::lsetxattr(
                &p,
                name.as_str(),
                &vec![b'p'; len],
                rustix::fs::XattrFlags::empty(),
            )
            .is_err()
            {
                filled = true;
                break;
            }
        }
    }
    if !filled {
        skip!("the temp file system never ran out of xattr space");
    }
    let j = intact!("tag", "--json", t.root()).expect_code(3).json();
    assert_eq!(j.file("crowded")["error_kind"], "no-space");
    assert!(
        j.file("crowded")["error"]
            .as_str()
            .unwrap()
            .contains("no space left")
    );
    assert!(getxattr(&p, TAG).is_none());
}

#[test]
fn missing_paths_are_errors_and_the_rest_is_processed() {
    let t = Tree::new();
    t.write("here", b"present");
    let r = intact!("tag", t.path("gone"), t.path("here")).expect_code(3);
    assert!(
        r.stderr.contains(&format!(
            "{}: no such file or directory",
            t.path("gone").display()
        )),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("tag: 1 file,"), "{}", r.stderr);
    assert!(getxattr(&t.path("here"), TAG).is_some());
}

#[test]
fn ctrl_c_stops_cleanly_without_a_tag() {
    let t = Tree::new();
    let p = t.path("huge");
    fs::File::create(&p).unwrap().set_len(16 << 30).unwrap();
    let child = Cmd::new(&[])
        .command()
        .args(["tag".as_ref(), "--json".as_ref(), p.as_os_str()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(start.elapsed() < Duration::from_secs(5), "slow to stop");
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        getxattr(&p, TAG).is_none(),
        "tag written for a file not fully read"
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["interrupted"], true);
    assert_eq!(summary["files"], 0);
}

/// Resident bytes of a file in the page cache, as util-linux's fincore reports them.
fn resident(path: &std::path::Path) -> u64 {
    let out = Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .expect("fincore (util-linux)");
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn background_checks_leave_the_page_cache_as_they_found_it() {
    let _cache = crate::faultfs::page_cache();
    let t = Tree::new();
    let cached = t.write("cached", data(16 << 20, 1));
    let cold = t.write("cold", data(16 << 20, 2));
    intact!("tag", t.root()).expect_code(0);
    flip_byte(&cold, 5 << 20);
    // One file in the cache (the user's working set), one out of it.
    fs::read(&cached).unwrap();
    let f = fs::File::open(&cold).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    assert_eq!(resident(&cached), 16 << 20);
    assert_eq!(resident(&cold), 0);

    let j = intact!("check", "--speed", "background", "--json", t.root())
        .expect_code(1)
        .json();
    assert_eq!(j.status("cached"), "ok");
    // Read from the disk, not from a cached copy, the damage is seen.
    assert_eq!(j.status("cold"), "corrupt");
    assert_eq!(
        resident(&cached),
        16 << 20,
        "the scrub evicted the user's cached file"
    );
    assert_eq!(resident(&cold), 0, "the scrub filled the cache");
}

#[test]
fn few_open_files_never_turn_cold_files_into_errors() {
    use std::os::fd::AsRawFd;
    let t = Tree::new();
    for i in 0..2_000 {
        t.write(format!("src/d{}/{i}", i % 10), data(4_096, i));
    }
    intact!("tag", t.path("src")).expect_code(0);
    // Cold: written back and dropped from the page cache, so the readers wake and open
    // files ahead of the workers.
    for i in 0..2_000 {
        let f = fs::File::open(t.path(format!("src/d{}/{i}", i % 10))).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on an open descriptor; it changes no data.
        unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    }
    // Readers far ahead must not leave a worker without a descriptor.
    let r = cmd!("check", "--json", t.path("src"))
        .open_files(64)
        .run()
        .expect_code(0)
        .json();
    assert_eq!(r.count("ok"), 2_000);
}

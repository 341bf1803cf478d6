//! Bad sectors: a read error anywhere (page cache, memory map, O_DIRECT, under FUSE or in
//! the block layer under ext4) is an `error` for that file within seconds, never a hang; the
//! run goes on over the other files and exits 3.

use std::fs;
use std::path::Path;
use std::time::Duration;

use crate::common::*;
use crate::faultfs::{BadDisk, FaultFs};

/// Far more than a healthy run of these trees takes; a hang is killed at this point.
const LIMIT: Duration = Duration::from_secs(60);

/// The verbs that read data, as `intact VERB ARGS... --json ROOT` would run them.
const READERS: [&[&str]; 5] = [
    &["check"],
    &["check", "--speed", "fast"],
    &["check", "--speed", "background"],
    &["tag", "--force"],
    &["update"],
];

/// Asserts that each of `bad` was an I/O error and each of `good` was not touched by one.
fn io_errors(j: &Json, bad: &[&str], good: &[&str], what: &str) {
    for name in bad {
        let f = j.file(name);
        assert_eq!(f["status"], "error", "{what}: {name}: {f}");
        assert_eq!(f["error_kind"], "io-error", "{what}: {name}: {f}");
    }
    for name in good {
        let f = j.file(name);
        assert!(f["error"].is_null(), "{what}: {name}: {f}");
    }
    assert_eq!(j.summary["exit_code"], 3, "{what}: {}", j.summary);
}

fn run_readers(root: &Path, bad: &[&str], good: &[&str]) {
    for verb in READERS {
        let j = cmd!()
            .args(verb)
            .arg("--json")
            .arg(root)
            .within(LIMIT)
            .run()
            .expect_code(3)
            .json();
        io_errors(&j, bad, good, &verb.join(" "));
    }
}

#[test]
fn a_bad_sector_seen_through_fuse_is_an_error_on_every_read_path() {
    require_faults!();
    for algo in ALGOS {
        let t = Tree::new();
        // Below 8 MiB files are read with pread; from 8 MiB on through memory maps.
        t.write("backing/small.bin", data(1 << 20, 1));
        t.write("backing/big.bin", data(24 << 20, 2));
        t.write("backing/good.bin", data(3 << 20, 3));
        let mnt = t.path("mnt");
        fs::create_dir(&mnt).unwrap();
        let fuse = FaultFs::mount(&t.path("backing"), &mnt).unwrap();
        intact!("tag", "--algo", algo, &mnt).expect_code(0);
        fuse.fail("small.bin", 512 << 10, (512 << 10) + 4096);
        fuse.fail("big.bin", 20 << 20, (20 << 20) + 4096);

        let (bad, good) = (&["small.bin", "big.bin"], &["good.bin"]);
        run_readers(&mnt, bad, good);
        let archive = t.path("a.tar.zst");
        let j = cmd!("archive", "create", "--json", &archive, &mnt)
            .within(LIMIT)
            .run()
            .expect_code(3)
            .json();
        io_errors(&j, bad, good, "archive create");
        assert_eq!(j.file("good.bin")["copy"], "archived");
        let listed = intact!("archive", "list", &archive).expect_code(0).stdout;
        assert!(
            listed.contains("good.bin") && !listed.contains("big.bin"),
            "{listed}"
        );
        let j = cmd!("protect", "--json", "--store", t.path("store"), &mnt)
            .within(LIMIT)
            .run()
            .expect_code(3)
            .json();
        io_errors(&j, bad, good, "protect");
        // Repair finds nothing it may repair (an unreadable file is not proven damaged).
        let j = cmd!("repair", "--json", "--from", &archive, &mnt)
            .within(LIMIT)
            .run()
            .expect_code(3)
            .json();
        io_errors(&j, bad, good, "repair");
    }
}

#[test]
fn a_bad_block_under_ext4_is_an_error_for_that_file_only() {
    require_faults!();
    let disk = BadDisk::new(128);
    let t = Tree::new();
    let root = &disk.root;
    let (big, small) = (root.join("big.bin"), root.join("small.bin"));
    fs::write(&big, data(24 << 20, 4)).unwrap();
    fs::write(&small, data(1 << 20, 5)).unwrap();
    fs::write(root.join("good.bin"), data(2 << 20, 6)).unwrap();
    intact!("tag", root).expect_code(0);
    let archive = t.path("before.tar.zst");
    intact!("archive", "create", &archive, root).expect_code(0);
    disk.fail(&big, 16 << 20);
    disk.fail(&small, 256 << 10);

    let (bad, good) = (&["small.bin", "big.bin"], &["good.bin"]);
    run_readers(root, bad, good);
    let j = cmd!("archive", "create", "--json", t.path("after.tar.zst"), root)
        .within(LIMIT)
        .run()
        .expect_code(3)
        .json();
    io_errors(&j, bad, good, "archive create");
    let j = cmd!("protect", "--json", root)
        .within(LIMIT)
        .run()
        .expect_code(3)
        .json();
    io_errors(&j, bad, good, "protect");
    assert_eq!(j.file("good.bin")["copy"], "protected");
    let j = cmd!("repair", "--json", "--from", &archive, root)
        .within(LIMIT)
        .run()
        .expect_code(3)
        .json();
    io_errors(&j, bad, good, "repair");

    // Once the disk reads again, the same files verify: nothing was written over them.
    disk.heal();
    intact!("check", root).expect_code(0);
}

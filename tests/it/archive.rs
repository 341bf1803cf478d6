//! Archives: stock GNU tar restores them byte for byte with xattrs, sparse files and links;
//! damaged files stay out; `archive verify` catches damage inside the archive.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

use crate::common::*;

/// A tree with the awkward cases: a sparse file, xattrs, odd names, an empty file, hard and
/// symbolic links.
fn awkward_tree(t: &Tree) {
    t.write("src/plain.txt", b"plain text\n");
    t.write("src/with space.bin", data(300_000, 1));
    t.write("src/empty", b"");
    t.write(OsStr::from_bytes(b"src/new\nline"), b"newline in the name");
    t.write(OsStr::from_bytes(b"src/latin1-\xe9t\xe9"), b"not UTF-8");
    t.write("src/deep/er/file", data(5000, 2));
    let sparse = t.path("src/sparse.img");
    let f = fs::File::create(&sparse).unwrap();
    f.set_len(16 << 20).unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"island of data", 5 << 20).unwrap();
    drop(f);
    fs::hard_link(t.path("src/plain.txt"), t.path("src/hardlink")).unwrap();
    std::os::unix::fs::symlink("plain.txt", t.path("src/symlink")).unwrap();
    setxattr(
        &t.path("src/plain.txt"),
        "user.note",
        b"a\nbinary\0value\xff",
    );
}

fn tar_extract(archive: &Path, into: &Path) {
    fs::create_dir_all(into).unwrap();
    let out = Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "-I", "zstd", "-xf"])
        .arg(archive)
        .arg("-C")
        .arg(into)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "tar warned: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn same_file(a: &Path, b: &Path) {
    assert_eq!(
        fs::read(a).unwrap(),
        fs::read(b).unwrap(),
        "{}",
        b.display()
    );
    let (ma, mb) = (fs::metadata(a).unwrap(), fs::metadata(b).unwrap());
    assert_eq!(ma.mode(), mb.mode(), "{}", b.display());
    assert_eq!(mtime(a), mtime(b), "{}", b.display());
    for name in [TAG, "user.note"] {
        assert_eq!(
            getxattr(a, name),
            getxattr(b, name),
            "{name} of {}",
            b.display()
        );
    }
}

#[test]
fn gnu_tar_restores_everything_byte_for_byte() {
    for algo in ALGOS {
        let t = Tree::new();
        awkward_tree(&t);
        let archive = t.path("a.tar.zst");
        let r = intact!(
            "archive",
            "create",
            "--algo",
            algo,
            "--json",
            archive,
            t.path("src")
        )
        .expect_code(0)
        .json();
        // Untagged files were tagged first, then archived.
        assert_eq!(r.summary["actions"]["archived"], 9, "{:?}", r.summary);
        assert_eq!(intact_tag(&t.path("src/plain.txt")).algo, algo);
        assert!(!t.path(".a.tar.zst.intact-tmp").exists());

        let out = t.path("out");
        tar_extract(&archive, &out);
        for rel in [
            &b"plain.txt"[..],
            b"with space.bin",
            b"empty",
            b"new\nline",
            b"latin1-\xe9t\xe9",
            b"deep/er/file",
            b"sparse.img",
        ] {
            let rel = Path::new(OsStr::from_bytes(rel));
            same_file(&t.path("src").join(rel), &out.join("src").join(rel));
        }
        // Hard links stay links, symlinks stay symlinks.
        let plain = fs::metadata(out.join("src/plain.txt")).unwrap();
        assert_eq!(
            fs::metadata(out.join("src/hardlink")).unwrap().ino(),
            plain.ino()
        );
        assert_eq!(
            fs::read_link(out.join("src/symlink")).unwrap(),
            Path::new("plain.txt")
        );
        // The sparse file is still sparse: 16 MiB long, a few blocks on disk.
        let sparse = fs::metadata(out.join("src/sparse.img")).unwrap();
        assert_eq!(sparse.len(), 16 << 20);
        assert!(
            sparse.blocks() * 512 < 1 << 20,
            "{} blocks",
            sparse.blocks()
        );
        // And the restored tree checks clean against the tags it brought along.
        intact!("check", out).expect_code(0);
    }
}

#[test]
fn owners_are_kept() {
    require_root!();
    let t = Tree::new();
    let f = t.write("src/owned", b"someone else's");
    rustix::fs::chown(
        &f,
        Some(rustix::fs::Uid::from_raw(1234)),
        Some(rustix::fs::Gid::from_raw(5678)),
    )
    .unwrap();
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", archive, t.path("src")).expect_code(0);
    tar_extract(&archive, &t.path("out"));
    let m = fs::metadata(t.path("out/src/owned")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
}

#[test]
fn verify_and_list_read_every_member() {
    let t = Tree::new();
    awkward_tree(&t);
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", archive, t.path("src")).expect_code(0);
    let v = intact!("archive", "verify", "--json", archive)
        .expect_code(0)
        .json();
    assert_eq!(v.count("ok"), 7);
    assert_eq!(v.status("sparse.img"), "ok");
    assert_eq!(v.status("new\\nline"), "ok");

    let list = intact!("archive", "list", archive).expect_code(0);
    // Walk order is by name: the inode goes in as `hardlink`, `plain.txt` links to it.
    let tag = intact_tag(&t.path("src/plain.txt"));
    let plain = format!("{}:{} src/hardlink", tag.algo, hex::encode(&tag.digest));
    assert!(list.stdout.contains(&plain), "{plain} in\n{}", list.stdout);
    assert!(list.stdout.contains(" 16777216 "), "{}", list.stdout);
    assert!(
        list.stdout.contains("src/latin1-\\xe9t\\xe9"),
        "{}",
        list.stdout
    );
    assert!(
        list.stdout.contains("src/symlink -> plain.txt"),
        "{}",
        list.stdout
    );
    assert!(
        list.stdout.contains("src/plain.txt -> src/hardlink"),
        "{}",
        list.stdout
    );
}

#[test]
fn an_archive_made_by_tar_in_frames_cut_anywhere_verifies() {
    let t = Tree::new();
    for i in 0..4 {
        t.write(format!("src/f{i}"), data(300_000, 70 + i));
    }
    intact!("tag", t.path("src")).expect_code(0);
    let out = Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "-cf", "-", "-C"])
        .arg(t.path(""))
        .arg("src")
        .output()
        .unwrap();
    assert!(out.status.success());
    // Two zstd frames (as pzstd makes), the cut inside a member's data and none opening
    // with intact's frame header: read as one part.
    let cut = out.stdout.len() / 2 + 1234;
    let mut zst = zstd::encode_all(&out.stdout[..cut], 3).unwrap();
    zst.extend(zstd::encode_all(&out.stdout[cut..], 3).unwrap());
    let archive = t.write("tar.tar.zst", zst);
    let v = intact!("archive", "verify", "--json", archive)
        .expect_code(0)
        .json();
    assert_eq!(v.count("ok"), 4);
}

#[test]
fn damaged_files_stay_out_unless_asked_and_then_are_marked() {
    // A small file is judged before it is written; a large one is written as it is verified,
    // and cut off the archive again once found damaged, before what follows it.
    for size in [10_000, 3 << 20] {
        let t = Tree::new();
        t.write("src/a-before", data(size, 2));
        let bad = t.write("src/bad", data(size, 4));
        t.write("src/good", data(size, 3));
        fs::hard_link(&bad, t.path("src/bad-link")).unwrap();
        intact!("tag", t.path("src")).expect_code(0);
        flip_byte(&bad, size as u64 / 2);
        // Past the moments after a change in which the engine reads a file itself.
        std::thread::sleep(std::time::Duration::from_millis(50));
        let archive = t.path("a.tar.zst");
        let r = intact!("archive", "create", archive, t.path("src")).expect_code(1);
        assert!(
            r.stdout.contains("corrupt  ") && r.stdout.contains("src/bad: not archived"),
            "{}",
            r.stdout
        );
        // Its other name carries the same damage.
        assert!(
            r.stdout.contains("src/bad-link: another name of"),
            "{}",
            r.stdout
        );
        // The damaged file kept its tag: the evidence.
        let list = intact!("archive", "list", archive).expect_code(0);
        assert!(
            list.stdout.contains("src/good")
                && list.stdout.contains("src/a-before")
                && !list.stdout.contains("src/bad"),
            "{}",
            list.stdout
        );
        let v = intact!("archive", "verify", "--json", archive)
            .expect_code(0)
            .json();
        assert_eq!(v.count("ok"), 2);
        let out = t.path("out");
        tar_extract(&archive, &out);
        for name in ["a-before", "good"] {
            same_file(&t.path("src").join(name), &out.join("src").join(name));
        }
        assert!(!out.join("src/bad").exists());

        intact!(
            "archive",
            "create",
            "--include-damaged",
            archive,
            t.path("src")
        )
        .expect_code(1);
        let list = intact!("archive", "list", archive).expect_code(0);
        assert!(
            list.stdout.contains("src/bad  [archived although corrupt]"),
            "{}",
            list.stdout
        );
        let v = intact!("archive", "verify", "--json", archive)
            .expect_code(1)
            .json();
        assert_eq!(v.status("bad"), "corrupt");
        assert_eq!(v.status("good"), "ok");
        assert_eq!(v.status("a-before"), "ok");
    }
}

#[test]
fn untagged_leaves_the_files_alone() {
    let t = Tree::new();
    let f = t.write("src/f", b"never tagged");
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", "--untagged", archive, t.path("src")).expect_code(0);
    assert_eq!(getxattr(&f, TAG), None);
    let v = intact!("archive", "verify", "--json", archive)
        .expect_code(0)
        .json();
    assert_eq!(v.status("f"), "new");
}

#[test]
fn damage_inside_the_archive_is_found() {
    let t = Tree::new();
    t.write("src/a", data(2 << 20, 5));
    t.write("src/b", b"after the damage".repeat(1000));
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", archive, t.path("src")).expect_code(0);
    // Random data is stored raw by zstd: a flip in the middle lands in member data, which
    // only the member's own digest (and the frame checksum at the end) can catch.
    let len = fs::metadata(&archive).unwrap().len();
    flip_byte(&archive, len / 2);
    let v = intact!("archive", "verify", archive).expect_code(1);
    assert!(
        v.stdout.contains("corrupt  src/a"),
        "{}{}",
        v.stdout,
        v.stderr
    );
    // A flip in the zstd frame header is damage too, not a usage error.
    flip_byte(&archive, 5);
    let v = intact!("archive", "verify", archive).expect_code(1);
    assert!(v.stderr.contains("intact: damaged: "), "{}", v.stderr);
    // The summary says the exit code the process returns.
    let j = intact!("archive", "verify", "--json", archive)
        .expect_code(1)
        .json();
    assert_eq!(j.summary["exit_code"], 1, "{:?}", j.summary);
    assert_eq!(j.summary["damage"].as_array().map(Vec::len), Some(1));
}

#[test]
fn not_an_archive_is_trouble_not_damage() {
    let t = Tree::new();
    let f = t.write("plain.txt", b"hello");
    let v = intact!("archive", "verify", f).expect_code(3);
    assert!(
        v.stderr.contains("not a zstd-compressed archive"),
        "{}",
        v.stderr
    );
    intact!("archive", "verify", t.path("missing")).expect_code(3);
}

#[test]
fn a_failed_archive_leaves_nothing_behind() {
    require_root!();
    let t = Tree::new();
    t.write("src/big", data(3 << 20, 6));
    let m = Mount::new("tmpfs", "size=1m", t.path("small"));
    let archive = m.0.join("a.tar.zst");
    let r = intact!("archive", "create", archive, t.path("src")).expect_code(3);
    assert!(r.stderr.contains("No space left"), "{}", r.stderr);
    assert_eq!(
        fs::read_dir(&m.0).unwrap().count(),
        0,
        "left behind in {}",
        m.0.display()
    );
}

#[test]
fn a_retag_to_another_algorithm_is_what_the_member_carries() {
    let t = Tree::new();
    let f = t.write("src/f", b"old and then edited");
    intact!("tag", t.path("src")).expect_code(0);
    let archive = t.path("a.tar.zst");
    intact!(
        "archive",
        "create",
        "--algo",
        "blake3",
        archive,
        t.path("src")
    )
    .expect_code(0);
    // Upgraded on the file, and the member carries that same tag.
    assert_eq!(intact_tag(&f).algo, "blake3");
    let v = intact!("archive", "verify", "--json", archive)
        .expect_code(0)
        .json();
    assert_eq!(v.status("f"), "ok");
}

#[test]
fn damage_costs_one_frame_and_reading_resumes_after_it() {
    let t = Tree::new();
    // Frames close at member boundaries past 64 MiB: a, b and c each get their own.
    let size = 65 << 20;
    for (name, seed) in [("a", 61), ("b", 62), ("c", 63)] {
        t.write(format!("src/{name}"), data(size, seed));
    }
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", archive, t.path("src")).expect_code(0);
    // Rot in the middle of a's frame.
    flip_byte(&archive, size as u64 / 2);
    let v = intact!("archive", "verify", "--json", archive).expect_code(1);
    let j = v.json();
    assert_ne!(j.status("a"), "ok", "{}", v.stdout);
    assert_eq!(j.status("b"), "ok", "{}", v.stdout);
    assert_eq!(j.status("c"), "ok", "{}", v.stdout);
    // And the copies after the damage still repair.
    let c = t.path("src/c");
    let good = fs::read(&c).unwrap();
    flip_byte(&c, 12345);
    intact!("repair", t.path("src"), "--from", archive).expect_code(0);
    assert_eq!(fs::read(&c).unwrap(), good);
    // A block header of b's frame damaged too: its blocks no longer lead to the next frame,
    // which is searched for instead.
    let bytes = fs::read(&archive).unwrap();
    let a_len = zstd::zstd_safe::find_frame_compressed_size(&bytes).unwrap();
    let fhd = bytes[a_len + 4];
    let header = 5
        + usize::from(fhd & 0x20 == 0)
        + [0, 1, 2, 4][usize::from(fhd & 3)]
        + match fhd >> 6 {
            0 => usize::from(fhd & 0x20 != 0),
            1 => 2,
            2 => 4,
            _ => 8,
        };
    // Bit 20 of the first block header: its size grows by 128 KiB.
    let f = fs::OpenOptions::new().write(true).open(&archive).unwrap();
    use std::os::unix::fs::FileExt;
    let at = (a_len + header + 2) as u64;
    f.write_all_at(&[bytes[a_len + header + 2] ^ 0x10], at)
        .unwrap();
    let v = intact!("archive", "verify", "--json", archive).expect_code(1);
    let j = v.json();
    assert_ne!(j.status("a"), "ok", "{}", v.stdout);
    // b's frame is lost from its first block, and b with it.
    assert!(!v.stdout.contains("src/b\""), "{}", v.stdout);
    assert_eq!(j.status("c"), "ok", "{}", v.stdout);
}

#[test]
fn a_repair_done_early_leaves_no_thread_waiting() {
    let t = Tree::new();
    // Three frames of 16,384 members or more: the threads reading the later ones fill their
    // queues and wait for them to be taken, which a repair done with the first member never
    // does; the run must still end.
    for i in 0..33_000u32 {
        t.write(format!("src/d{:02}/f{i:05}", i % 100), i.to_le_bytes());
    }
    let archive = t.path("a.tar.zst");
    intact!("archive", "create", archive, t.path("src")).expect_code(0);
    let first = t.path("src/d00/f00000");
    flip_byte(&first, 0);
    intact!(
        "repair",
        "--discard-damaged",
        t.path("src"),
        "--from",
        archive
    )
    .expect_code(0);
    assert_eq!(fs::read(&first).unwrap(), 0u32.to_le_bytes());
}

#[test]
fn archiving_is_a_verification_recorded_as_one() {
    // Files whose tags describe them are verified from the very bytes archived (small ones
    // before they are written, large ones as they are): each is reported ok, and the state
    // database knows them verified.
    let t = Tree::new();
    t.write("src/small", data(10_000, 1));
    t.write("src/large", data(3 << 20, 2));
    let db = t.path("state.db");
    intact!("tag", t.path("src")).expect_code(0);
    let never = || {
        let out = intact!("status", "--json", "--state", &db, t.path("src"))
            .expect_code(0)
            .stdout;
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["never_verified"].clone()
    };
    assert_eq!(never(), 2);
    let archive = t.path("a.tar.zst");
    let j = intact!(
        "archive",
        "create",
        "--json",
        "--state",
        &db,
        &archive,
        t.path("src")
    )
    .expect_code(0)
    .json();
    for name in ["small", "large"] {
        assert_eq!(j.status(name), "ok");
        assert_eq!(j.file(name)["copy"], "archived");
    }
    assert_eq!(never(), 0);
}

#[test]
fn files_left_open_for_the_archive_never_exhaust_descriptors() {
    // The engine hands the archive writer the files it left unread, still open; thousands
    // of them wait in its queues at once on a tree of small files, yet a process allowed 64
    // descriptors archives every one.
    let t = Tree::new();
    for i in 0..2_000 {
        t.write(format!("src/d{}/{i}", i % 10), data(4_096, i));
    }
    intact!("tag", t.path("src")).expect_code(0);
    // Past the racy window, the engine leaves them unread for the writer.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let archive = t.path("a.tar.zst");
    let j = cmd!(
        "archive",
        "create",
        "--json",
        "--no-state",
        &archive,
        t.path("src")
    )
    .open_files(64)
    .run()
    .expect_code(0)
    .json();
    assert_eq!(j.count("ok"), 2_000);
    let into = t.path("out");
    fs::create_dir(&into).unwrap();
    tar_extract(&archive, &into);
    for i in [0, 999, 1_999] {
        let name = format!("d{}/{i}", i % 10);
        same_file(
            &t.path(format!("src/{name}")),
            &into.join("src").join(&name),
        );
    }
}

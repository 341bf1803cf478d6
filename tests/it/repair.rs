//! Repair: damaged files get their bytes back from archives and backup trees, found by
//! digest, verified before anything is replaced, and nothing is written outside the tree.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

fn archive(t: &Tree, src: &Path) -> PathBuf {
    let a = t.path("copy.tar.zst");
    intact!("archive", "create", a, src).expect_code(0);
    a
}

#[test]
fn from_an_archive_bit_exact_with_metadata_even_after_a_rename() {
    for algo in ALGOS {
        let t = Tree::new();
        let photo = t.write("src/photos/photo.jpg", data(700_000, 1));
        let doc = t.write("src/doc.txt", data(5_000, 2));
        let moved_before = t.write("src/old-name.bin", data(100_000, 3));
        fs::set_permissions(&photo, fs::Permissions::from_mode(0o640)).unwrap();
        setxattr(&photo, "user.note", b"keep me");
        intact!("tag", "--algo", algo, t.path("src")).expect_code(0);
        let a = archive(&t, &t.path("src"));

        let moved = t.path("src/photos/new-name.bin");
        fs::rename(&moved_before, &moved).unwrap();
        let (good_photo, good_moved) = (fs::read(&photo).unwrap(), fs::read(&moved).unwrap());
        let before = (mtime(&photo), getxattr(&photo, TAG));
        flip_byte(&photo, 123_456);
        flip_byte(&moved, 7);
        intact!("check", t.path("src")).expect_code(1);

        let r = intact!("repair", "--json", t.path("src"), "--from", a)
            .expect_code(0)
            .json();
        assert_eq!(r.file("photo.jpg")["action"], "repaired");
        assert_eq!(r.file("new-name.bin")["action"], "repaired");
        assert_eq!(r.summary["actions"]["repaired"], 2);

        assert_eq!(fs::read(&photo).unwrap(), good_photo);
        assert_eq!(fs::read(&moved).unwrap(), good_moved);
        assert_eq!((mtime(&photo), getxattr(&photo, TAG)), before);
        assert_eq!(getxattr(&photo, "user.note").unwrap(), b"keep me");
        assert_eq!(fs::metadata(&photo).unwrap().mode() & 0o7777, 0o640);
        // The damaged originals are kept beside, untagged so they are not reported again.
        let kept = t.path("src/photos/photo.jpg.damaged");
        assert_ne!(fs::read(&kept).unwrap(), good_photo);
        assert_eq!(getxattr(&kept, TAG), None);
        assert!(leftovers(&t.path("src/photos")).is_empty());
        intact!("check", t.path("src")).expect_code(0);
        let _ = doc;
    }
}

#[test]
fn dry_run_says_from_where_and_changes_nothing() {
    let t = Tree::new();
    let f = t.write("src/f", data(50_000, 4));
    let a = archive(&t, &t.path("src"));
    flip_byte(&f, 10);
    let damaged = fs::read(&f).unwrap();
    let r = intact!("repair", "-n", t.path("src"), "--from", a).expect_code(1);
    assert!(
        r.stdout.contains("src/f: would be repaired from"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("copy.tar.zst (src/f)"), "{}", r.stdout);
    assert_eq!(fs::read(&f).unwrap(), damaged);
    assert_eq!(fs::read_dir(t.path("src")).unwrap().count(), 1);
}

#[test]
fn from_a_backup_tree_skipping_a_backup_copy_that_is_itself_corrupt() {
    let t = Tree::new();
    let a = t.write("src/a.bin", data(200_000, 5));
    let b = t.write("src/sub/b.bin", data(200_000, 6));
    intact!("tag", t.path("src")).expect_code(0);
    for (tool, args) in [("cp", &["-a"][..]), ("rsync", &["-aX"][..])] {
        let backup = t.path(format!("backup-{tool}"));
        let mut cmd = Command::new(tool);
        cmd.args(args);
        if tool == "rsync" {
            cmd.arg(format!("{}/", t.path("src").display()));
        } else {
            cmd.arg(t.path("src"));
        }
        let status = cmd.arg(&backup).status().unwrap();
        assert!(status.success(), "{tool}");
    }
    let good_a = fs::read(&a).unwrap();
    flip_byte(&a, 1000);
    flip_byte(&b, 2000);
    // The cp copy of b is rotten too; the rsync copy is good.
    flip_byte(&t.path("backup-cp/sub/b.bin"), 3000);
    let good_b = fs::read(t.path("backup-rsync/sub/b.bin")).unwrap();

    // From the cp copy alone: a is repaired, b's only copy is damaged.
    let r = intact!("repair", t.path("src"), "--from", t.path("backup-cp")).expect_code(1);
    assert!(r.stdout.contains("repaired "), "{}", r.stdout);
    assert!(
        r.stdout.contains("src/sub/b.bin: no good copy found: "),
        "{}",
        r.stdout
    );
    assert_eq!(fs::read(&a).unwrap(), good_a);
    // With the rsync copy as a second source, b is repaired from it.
    let r = intact!(
        "repair",
        t.path("src"),
        "--from",
        t.path("backup-cp"),
        "--from",
        t.path("backup-rsync")
    )
    .expect_code(0);
    assert!(r.stdout.contains("backup-rsync ("), "{}", r.stdout);
    assert_eq!(fs::read(&b).unwrap(), good_b);
}

#[test]
fn a_damaged_copy_in_the_archive_is_refused() {
    let t = Tree::new();
    let f = t.write("src/f", data(1 << 20, 7));
    let a = archive(&t, &t.path("src"));
    flip_byte(&f, 100);
    let damaged = fs::read(&f).unwrap();
    // Random data is stored raw: this flip lands in the member's bytes.
    flip_byte(&a, fs::metadata(&a).unwrap().len() / 2);
    let r = intact!("repair", t.path("src"), "--from", a).expect_code(1);
    assert!(r.stdout.contains("corrupt  "), "{}", r.stdout);
    // Whether zstd or the member's digest catches it, the copy is refused.
    assert!(r.stdout.contains("no good copy found: "), "{}", r.stdout);
    assert_eq!(fs::read(&f).unwrap(), damaged);
    assert!(leftovers(&t.path("src")).is_empty());
}

#[test]
fn hostile_member_names_never_decide_where_bytes_go() {
    let t = Tree::new();
    let f = t.write("root/sub/f", data(10_000, 8));
    intact!("tag", t.path("root")).expect_code(0);
    let good = fs::read(&f).unwrap();
    let tag = getxattr(&f, TAG).unwrap();
    // A hand-made archive whose members, carrying the right bytes and tag, are named to
    // escape: upwards, absolute, and through a symlink planted in the tree.
    std::os::unix::fs::symlink(t.path("outside"), t.path("root/sub/link")).unwrap();
    let mut builder = tar::Builder::new(Vec::new());
    for name in [
        "../../escape",
        "/tmp/intact-absolute-escape",
        "sub/link/escape",
    ] {
        builder
            .append_pax_extensions([
                ("path", name.as_bytes()),
                ("SCHILY.xattr.user.intact", &tag[..]),
            ])
            .unwrap();
        let mut h = tar::Header::new_ustar();
        h.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_size(good.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        builder.append(&h, &good[..]).unwrap();
    }
    let tar = builder.into_inner().unwrap();
    let a = t.path("hostile.tar.zst");
    fs::File::create(&a)
        .unwrap()
        .write_all(&zstd::encode_all(&tar[..], 3).unwrap())
        .unwrap();
    flip_byte(&f, 0);
    intact!("repair", t.path("root"), "--from", a).expect_code(0);
    assert_eq!(fs::read(&f).unwrap(), good);
    assert!(!t.path("escape").exists());
    assert!(!t.path("outside").exists());
    assert!(!Path::new("/tmp/intact-absolute-escape").exists());
    assert!(!t.root().parent().unwrap().join("escape").exists());
}

#[test]
fn a_full_disk_leaves_the_original_untouched() {
    require_root!();
    let t = Tree::new();
    let m = Mount::new("tmpfs", "size=1m", t.path("small"));
    let f = m.0.join("f");
    fs::write(&f, data(600_000, 9)).unwrap();
    intact!("tag", m.0).expect_code(0);
    let a = t.path("copy.tar.zst");
    intact!("archive", "create", a, m.0).expect_code(0);
    flip_byte(&f, 300_000);
    let damaged = fs::read(&f).unwrap();
    let r = intact!("repair", m.0, "--from", a).expect_code(1);
    assert!(
        r.stdout.contains("cannot repair: no space left"),
        "{}",
        r.stdout
    );
    assert_eq!(fs::read(&f).unwrap(), damaged);
    assert!(getxattr(&f, TAG).is_some());
    assert!(leftovers(&m.0).is_empty(), "{:?}", leftovers(&m.0));
}

#[test]
fn hard_links_are_repaired_in_place_so_every_name_sees_it() {
    let t = Tree::new();
    let f = t.write("src/one", data(300_000, 10));
    fs::hard_link(&f, t.path("src/two")).unwrap();
    let a = archive(&t, &t.path("src"));
    let good = fs::read(&f).unwrap();
    let ino = fs::metadata(&f).unwrap().ino();
    flip_byte(&f, 299_999);
    let when = mtime(&f);
    // The damage is said under every name that carries it, the inode read once.
    let j = intact!("check", "--json", t.path("src"))
        .expect_code(1)
        .json();
    assert_eq!(j.status("one"), "corrupt");
    assert_eq!(j.status("two"), "corrupt");
    assert!(
        j.file("two")["detail"]
            .as_str()
            .unwrap()
            .contains("another name of")
    );
    assert_eq!(j.summary["bytes"], 300_000);
    let j = intact!("repair", "--json", t.path("src"), "--from", a)
        .expect_code(0)
        .json();
    assert_eq!(j.file("one")["action"], "repaired");
    assert_eq!(j.status("two"), "ok");
    assert_eq!(fs::metadata(&f).unwrap().ino(), ino);
    assert_eq!(fs::read(t.path("src/two")).unwrap(), good);
    assert_eq!(mtime(&f), when);
    assert_ne!(fs::read(t.path("src/one.damaged")).unwrap(), good);
}

#[test]
fn kept_damaged_copies_are_marked_and_never_taken_for_good_files() {
    let t = Tree::new();
    let long = "n".repeat(250);
    let f = t.write(format!("src/{long}"), data(40_000, 12));
    let g = t.write("src/short", data(40_000, 13));
    let a = archive(&t, &t.path("src"));
    flip_byte(&f, 10);
    flip_byte(&g, 10);
    // Quiet, and still a line for each file replaced: the record of what changed.
    let r = intact!("repair", "-q", t.path("src"), "--from", a).expect_code(0);
    assert_eq!(
        r.stdout
            .lines()
            .filter(|l| l.starts_with("repaired "))
            .count(),
        2,
        "{}",
        r.stdout
    );
    let kept = t.path("src/short.damaged");
    assert!(getxattr(&kept, "user.intact.damaged").is_some());
    // The long name is shortened to fit, not hidden.
    let shortened: Vec<_> = fs::read_dir(t.path("src"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".damaged") && n.starts_with("nnn"))
        .collect();
    assert_eq!(shortened.len(), 1, "{shortened:?}");
    assert!(shortened[0].len() <= 255);
    // Later runs skip them: not new, and tag leaves them untagged.
    let j = intact!("check", "--json", t.path("src"))
        .expect_code(0)
        .json();
    assert_eq!(j.status("short.damaged"), "skipped");
    assert_eq!(j.file("short.damaged")["skip"], "kept-damaged");
    assert_eq!(j.count("new"), 0);
    intact!("tag", t.path("src")).expect_code(0);
    assert!(getxattr(&kept, TAG).is_none());
}

#[test]
fn damaged_originals_can_be_kept_elsewhere_or_discarded() {
    let t = Tree::new();
    let f = t.write("src/d/f", data(20_000, 11));
    let a = archive(&t, &t.path("src"));
    flip_byte(&f, 1);
    let damaged = fs::read(&f).unwrap();
    let keep = t.path("quarantine");
    intact!(
        "repair",
        t.path("src"),
        "--from",
        a,
        "--keep-damaged-in",
        keep
    )
    .expect_code(0);
    assert_eq!(fs::read(keep.join("d/f")).unwrap(), damaged);
    assert_eq!(fs::read_dir(t.path("src/d")).unwrap().count(), 1);

    flip_byte(&f, 1);
    intact!("repair", t.path("src"), "--from", a, "--discard-damaged").expect_code(0);
    assert_eq!(fs::read_dir(t.path("src/d")).unwrap().count(), 1);
    intact!("check", t.path("src")).expect_code(0);
}

#[test]
fn a_mass_repair_with_few_open_files_repairs_every_file() {
    let t = Tree::new();
    let mut files = Vec::new();
    for i in 0..300 {
        let bytes = data(3_000, 400 + i);
        files.push((t.write(format!("src/d{}/{i}", i % 3), &bytes), bytes));
    }
    let a = archive(&t, &t.path("src"));
    for (f, _) in &files {
        flip_byte(f, 1_000);
    }
    // Verified copies wait to be put in place together, each holding files open: the
    // batch must fit what the process may open, or repairs would fail for want of a file.
    let r = cmd!("repair", "--discard-damaged", t.path("src"), "--from", &a)
        .open_files(64)
        .run()
        .expect_code(0);
    assert_eq!(r.stdout.matches("repaired").count(), 300, "{}", r.stdout);
    for (f, bytes) in &files {
        assert_eq!(&fs::read(f).unwrap(), bytes, "{}", f.display());
    }
    intact!("check", t.path("src")).expect_code(0);
}

#[test]
fn nothing_damaged_means_nothing_to_do() {
    let t = Tree::new();
    t.write("src/f", b"fine");
    let a = archive(&t, &t.path("src"));
    let r = intact!("repair", t.path("src"), "--from", a).expect_code(0);
    assert!(!r.stdout.contains("repaired"), "{}", r.stdout);
}

#[test]
fn names_at_the_length_limit_and_single_file_roots() {
    let t = Tree::new();
    let long = "n".repeat(250);
    let f = t.write(format!("src/{long}"), data(9_000, 12));
    let a = archive(&t, &t.path("src"));
    let good = fs::read(&f).unwrap();
    flip_byte(&f, 5);
    intact!("repair", t.path("src"), "--from", a).expect_code(0);
    assert_eq!(fs::read(&f).unwrap(), good);
    // The damaged copy could not be NAME.damaged (past 255 bytes): it got a short name.
    assert_eq!(fs::read_dir(t.path("src")).unwrap().count(), 2);

    // A root that is the file itself, its damaged copy kept elsewhere under its name.
    flip_byte(&f, 6);
    let keep = t.path("keep");
    intact!("repair", f, "--from", a, "--keep-damaged-in", keep).expect_code(0);
    assert_eq!(fs::read(&f).unwrap(), good);
    assert!(keep.join(&long).exists());
}

/// A file edited while its copy was read is left as the edit left it, and the report says
/// why in words and in a kind a script can act on (`changed`: run repair again).
#[test]
fn a_file_edited_while_its_copy_is_read_is_left_as_the_edit_left_it() {
    let t = Tree::new();
    let doc = t.write("src/doc.bin", data(50_000, 4));
    intact!("tag", "-q", t.path("src")).expect_code(0);
    let copy = t.path("copy");
    fs::create_dir_all(&copy).unwrap();
    fs::copy(&doc, copy.join("doc.bin")).unwrap();
    flip_byte(&doc, 100);
    // The source appends to the damaged file before it prints the good copy.
    let editing = format!(
        "printf edit >> {}; cat {}/{{}}",
        doc.display(),
        copy.display()
    );
    let r = intact!(
        "repair",
        "--json",
        "--no-state",
        "--from-command",
        &editing,
        t.path("src")
    )
    .json();
    let file = r.file("doc.bin");
    assert_eq!(file["error_kind"], "changed", "{file}");
    let said = file["error"].as_str().unwrap();
    assert!(said.contains("changed while its copy was read"), "{said}");
    let now = fs::read(&doc).unwrap();
    assert!(now.ends_with(b"edit"), "the edit was overwritten");
    assert_eq!(now.len(), 50_004);
    assert!(leftovers(&t.path("src")).is_empty());
}

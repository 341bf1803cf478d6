//! Parity: `protect` writes PAR2 that par2cmdline verifies and repairs with; `repair` uses
//! intact's store and sets made by par2cmdline, and never trusts what it rebuilds until it
//! hashes to the tag.

use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

fn par2(dir: &Path, args: &[&OsStr]) -> (bool, String) {
    let out = Command::new("par2")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("par2 (par2cmdline) is installed");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// par2cmdline verifies the files of `set` under `base` (its names are relative to it).
fn verifies(base: &Path, set: &Path) {
    let (ok, out) = par2(
        base,
        &[
            "verify".as_ref(),
            "-B".as_ref(),
            base.as_os_str(),
            set.as_os_str(),
        ],
    );
    assert!(ok, "{}: {out}", set.display());
}

/// `par2 repair -B BASE SET` succeeds.
fn repairs(base: &Path, set: &Path) {
    let (ok, out) = par2(
        base,
        &[
            "repair".as_ref(),
            "-B".as_ref(),
            base.as_os_str(),
            set.as_os_str(),
        ],
    );
    assert!(ok, "{}: {out}", set.display());
}

/// The index files (`NAME.par2`, not volumes) under a store.
fn index_files(store: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in fs::read_dir(store).unwrap() {
        let dir = dir.unwrap().path();
        if !dir.is_dir() {
            continue;
        }
        for f in fs::read_dir(&dir).unwrap() {
            let f = f.unwrap().path();
            let name = f.file_name().unwrap().to_string_lossy().into_owned();
            if name.ends_with(".par2") && !name.contains(".vol") {
                out.push(f);
            }
        }
    }
    out.sort();
    out
}

fn tree(t: &Tree) -> PathBuf {
    t.write("src/big.bin", data(1_500_000, 1));
    for i in 0..30 {
        t.write(
            format!("src/small/s{i:02}"),
            data(100 + i * 97, 10 + i as u64),
        );
    }
    t.path("src")
}

#[test]
fn par2cmdline_verifies_and_repairs_what_protect_wrote() {
    let t = Tree::new();
    let src = tree(&t);
    intact!("protect", src).expect_code(0);
    let store = src.join(".intact-parity");
    let sets = index_files(&store);
    // One set for the large file, one pack for the thirty small ones.
    assert_eq!(sets.len(), 2, "{sets:?}");
    for set in &sets {
        verifies(&src, set);
    }
    let good_big = fs::read(src.join("big.bin")).unwrap();
    let good_small = fs::read(src.join("small/s07")).unwrap();
    flip_byte(&src.join("big.bin"), 777_777);
    flip_byte(&src.join("small/s07"), 3);
    for set in &sets {
        repairs(&src, set);
    }
    assert_eq!(fs::read(src.join("big.bin")).unwrap(), good_big);
    assert_eq!(fs::read(src.join("small/s07")).unwrap(), good_small);
}

#[test]
fn repair_from_the_store_finds_moved_files_and_verifies() {
    for algo in ALGOS {
        let t = Tree::new();
        let src = tree(&t);
        intact!("tag", "--algo", algo, src).expect_code(0);
        let r = intact!("protect", "--json", src).expect_code(0).json();
        assert_eq!(r.summary["actions"]["protected"], 31);
        // Protecting again writes nothing, and says the files are protected already.
        let before = walkdir_count(&src.join(".intact-parity"));
        let again = intact!("protect", "--json", src).expect_code(0).json();
        assert_eq!(again.summary["actions"]["protected"], 31);
        for f in &again.files {
            assert_eq!(f["detail"], "its content already had parity", "{f}");
        }
        assert_eq!(walkdir_count(&src.join(".intact-parity")), before);

        let good_big = fs::read(src.join("big.bin")).unwrap();
        let good_small = fs::read(src.join("small/s20")).unwrap();
        // A zeroed 64 KiB run in a file moved since, and a flipped bit in a small one.
        fs::create_dir(src.join("moved")).unwrap();
        fs::rename(src.join("big.bin"), src.join("moved/renamed.bin")).unwrap();
        behind_the_back(&src.join("moved/renamed.bin"), |p| {
            let mut b = fs::read(p).unwrap();
            b[200_000..200_000 + 65536].fill(0);
            fs::write(p, b).unwrap();
        });
        flip_byte(&src.join("small/s20"), 100);
        intact!("check", src).expect_code(1);
        // No --from: the tree's own store is used.
        let r = intact!("repair", "--discard-damaged", src).expect_code(0);
        assert!(r.stdout.contains("restored from parity in"), "{}", r.stdout);
        assert_eq!(fs::read(src.join("moved/renamed.bin")).unwrap(), good_big);
        assert_eq!(fs::read(src.join("small/s20")).unwrap(), good_small);
        intact!("check", src).expect_code(0);
    }
}

#[test]
fn more_damage_than_the_redundancy_is_refused_and_the_original_kept() {
    let t = Tree::new();
    let src = tree(&t);
    intact!("protect", "--redundancy", "1%", src).expect_code(0);
    let big = src.join("big.bin");
    behind_the_back(&big, |p| {
        let mut b = fs::read(p).unwrap();
        for k in 0..200 {
            b[k * 7000] ^= 1;
        }
        fs::write(p, b).unwrap();
    });
    let damaged = fs::read(&big).unwrap();
    let r = intact!("repair", src).expect_code(1);
    assert!(
        r.stdout.contains("more damage than the redundancy covers"),
        "{}",
        r.stdout
    );
    assert_eq!(fs::read(&big).unwrap(), damaged);
}

#[test]
fn damaged_recovery_files_cost_only_their_damaged_slices() {
    let t = Tree::new();
    let src = tree(&t);
    intact!("protect", src).expect_code(0);
    // Rot inside the big file's volume: a few recovery packets fail their MD5.
    let store = src.join(".intact-parity");
    let set = index_files(&store)
        .into_iter()
        .find(|p| !p.to_string_lossy().contains("packs"))
        .unwrap();
    let dir = set.parent().unwrap();
    let volume = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().contains(".vol"))
        .unwrap();
    let len = fs::metadata(&volume).unwrap().len();
    for k in 1..5 {
        flip_byte(&volume, len * k / 6);
    }
    let big = src.join("big.bin");
    let good = fs::read(&big).unwrap();
    flip_byte(&big, 1000);
    intact!("repair", src).expect_code(0);
    assert_eq!(fs::read(&big).unwrap(), good);
}

#[test]
fn sets_made_by_par2cmdline_repair_bit_flips_zeroed_runs_and_truncations() {
    let t = Tree::new();
    let src = t.path("src");
    let files = [
        ("a.bin", data(400_000, 21)),
        ("b.bin", data(300_000, 22)),
        ("c.bin", data(200_000, 23)),
    ];
    for (name, bytes) in &files {
        t.write(format!("src/{name}"), bytes);
    }
    intact!("tag", src).expect_code(0);
    let (ok, out) = par2(
        &src,
        &[
            "create", "-q", "-s8192", "-r25", "set.par2", "a.bin", "b.bin", "c.bin",
        ]
        .map(OsStr::new),
    );
    assert!(ok, "{out}");
    // 110 slices of 8 KiB, 28 recovery slices; 1 + 9 + 7 slices damaged.
    flip_byte(&src.join("a.bin"), 12_345);
    behind_the_back(&src.join("b.bin"), |p| {
        let mut b = fs::read(p).unwrap();
        b[100_000..100_000 + 65536].fill(0);
        fs::write(p, b).unwrap();
    });
    behind_the_back(&src.join("c.bin"), |p| {
        fs::write(p, &fs::read(p).unwrap()[..150_000]).unwrap();
    });
    intact!("check", src).expect_code(1);
    intact!(
        "repair",
        "--discard-damaged",
        src,
        "--from",
        src.join("set.par2")
    )
    .expect_code(0);
    for (name, bytes) in &files {
        assert_eq!(&fs::read(src.join(name)).unwrap(), bytes, "{name}");
    }
}

#[test]
fn hostile_names_in_a_set_are_never_followed() {
    let t = Tree::new();
    let f = t.write("root/f", data(50_000, 31));
    intact!("tag", t.path("root")).expect_code(0);
    let good = fs::read(&f).unwrap();
    // A valid set whose file is named to climb out of its directory.
    let name = b"../root/f".to_vec();
    fs::create_dir(t.path("sets")).unwrap();
    let mut volume = fs::File::create(t.path("sets/evil.vol0+4.par2")).unwrap();
    let created = par2::create(
        &[par2::Input {
            name,
            len: good.len() as u64,
        }],
        &mut vec![good.clone()],
        &par2::Plan {
            slice_size: 4096,
            recovery_count: 4,
            threads: 1,
            memory: 1 << 20,
        },
        &mut volume,
    )
    .unwrap();
    fs::write(t.path("sets/evil.par2"), &created.index).unwrap();
    flip_byte(&f, 10);
    let r = intact!("repair", t.path("root"), "--from", t.path("sets/evil.par2")).expect_code(1);
    assert!(r.stdout.contains("no good copy found"), "{}", r.stdout);
    assert_ne!(fs::read(&f).unwrap(), good);
}

#[test]
fn a_pack_survives_its_members_moving_and_its_index_rotting() {
    let t = Tree::new();
    let src = tree(&t);
    intact!("protect", src).expect_code(0);
    // Every small file moves (30 of them: ten times what the pack's 3 recovery slices could
    // rebuild if they counted as missing), and the pack's index file rots.
    fs::rename(src.join("small"), src.join("renamed")).unwrap();
    let pack = index_files(&src.join(".intact-parity"))
        .into_iter()
        .find(|p| p.to_string_lossy().contains("packs"))
        .unwrap();
    flip_byte(&pack, 100);
    let victim = src.join("renamed/s11");
    let good = fs::read(&victim).unwrap();
    flip_byte(&victim, 50);
    intact!("repair", "--discard-damaged", src).expect_code(0);
    assert_eq!(fs::read(&victim).unwrap(), good);
}

#[test]
fn a_store_serves_one_tree() {
    let t = Tree::new();
    t.write("one/f", data(1000, 41));
    t.write("two/g", data(1000, 42));
    let store = t.path("store");
    intact!("protect", "--store", store, t.path("one")).expect_code(0);
    let r = intact!("protect", "--store", store, t.path("two"));
    assert_eq!(r.code, 2, "{}{}", r.stdout, r.stderr);
    assert!(
        r.stderr.contains("give each tree its own store"),
        "{}",
        r.stderr
    );
}

/// How many files are under `dir`.
fn walkdir_count(dir: &Path) -> usize {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walkdir_count(&e.path())
            } else {
                1
            }
        })
        .sum()
}

#[test]
fn many_small_files_are_settled_in_slices_and_all_protected() {
    // More files than the protector holds reports for: it forces their packs out part way.
    let t = Tree::new();
    let n = 9000;
    for i in 0..n {
        t.write(
            format!("src/d{:02}/f{i:05}", i % 50),
            data(40, 7 + i as u64),
        );
    }
    let src = t.path("src");
    let r = intact!("protect", "--json", src).expect_code(0).json();
    let protected = r.files.iter().filter(|f| f["copy"] == "protected").count();
    assert_eq!(protected, n, "{}", r.summary);
    for (i, victim) in [(3, "src/d03/f00003"), (8950, "src/d00/f08950")] {
        let victim = t.path(victim);
        let good = fs::read(&victim).unwrap();
        flip_byte(&victim, 5);
        intact!("repair", "--discard-damaged", src).expect_code(0);
        assert_eq!(fs::read(&victim).unwrap(), good, "file {i}");
    }
}

#[test]
fn a_file_whose_recovery_data_exceeds_the_memory_is_protected_in_passes() {
    let t = Tree::new();
    // 20 MiB at 10%: 2,000 slices of 10 KiB, 200 recovery slices (2 MiB). With eight
    // workers, each set gets 3 MiB, of which less than 2 MiB for recovery data: two passes,
    // the second reading ranges of each slice.
    let good = data(20 << 20, 41);
    let f = t.write("root/big", good.clone());
    intact!("tag", t.path("root")).expect_code(0);
    intact!("protect", "-j", "8", t.path("root")).expect_code(0);
    let sets = index_files(&t.path("root/.intact-parity"));
    verifies(&t.path("root"), &sets[0]);
    // Damage in several slices, in every range a pass covers.
    for at in [5, 10_000, 1_000_000, 7_777_777, 20_000_000] {
        flip_byte(&f, at);
    }
    intact!("repair", "--discard-damaged", t.path("root")).expect_code(0);
    assert!(fs::read(&f).unwrap() == good, "repaired bit-exactly");
}

#[test]
fn a_file_of_32_gib_is_protected_within_64_mib() {
    // 2,000 slices of 16.8 MiB: larger than the first pass holds whole, so their checksums
    // are taken as the file streams by (the par2 crate's tests count what that holds,
    // whatever the slices' size, and have par2cmdline check sets made so). Sparse, so it
    // costs no disk; 0.1% redundancy, two recovery slices. The run's data segment
    // (RLIMIT_DATA: heap, maps, thread stacks) is capped at the 64 MiB the docs promise.
    let t = Tree::new();
    let f = t.write("root/huge", b"");
    let file = fs::OpenOptions::new().write(true).open(&f).unwrap();
    file.set_len(32 << 30).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&file, b"not only zeros", 1_000_000).unwrap();
    drop(file);
    let r = cmd!()
        .args(["protect", "-r", "0.1%"])
        .arg(t.path("root"))
        .memory_limit(64 << 20)
        .run()
        .expect_code(0);
    assert!(r.stderr.contains("1 protected"), "{}", r.stderr);
    let sets = index_files(&t.path("root/.intact-parity"));
    assert_eq!(sets.len(), 1, "{sets:?}");
}

#[test]
fn damaged_members_of_a_pack_are_rebuilt_together_and_twins_in_turns() {
    let t = Tree::new();
    let src = tree(&t);
    // A twin of s03: one member of the pack serves both.
    t.write("src/twin", fs::read(src.join("small/s03")).unwrap());
    intact!("protect", "-r", "20%", &src).expect_code(0);
    let names = ["small/s03", "small/s05", "small/s29", "twin"];
    let good: Vec<Vec<u8>> = names
        .iter()
        .map(|n| fs::read(src.join(n)).unwrap())
        .collect();
    for n in names {
        flip_byte(&src.join(n), 7);
    }
    let r = intact!("repair", "--discard-damaged", &src).expect_code(0);
    for (n, good) in names.iter().zip(&good) {
        assert!(fs::read(src.join(n)).unwrap() == *good, "{n}: {}", r.stdout);
        assert!(
            r.stdout
                .contains(&format!("{n}: was corrupt; restored from parity")),
            "{n}: {}",
            r.stdout
        );
    }
}

#[test]
fn damage_met_by_the_parity_read_is_reported_and_gets_no_parity() {
    // Files whose tags describe them are read once, by their set's first pass, which is then
    // their verification: damage found there is corrupt (not a file that changed), its
    // content gets no parity, and the rest is protected and recorded as verified.
    let t = Tree::new();
    let src = tree(&t);
    t.write("src/small/twin-a", data(5000, 77));
    t.write("src/small/twin-b", data(5000, 77));
    fs::hard_link(src.join("big.bin"), src.join("other-name.bin")).unwrap();
    intact!("tag", &src).expect_code(0);
    for name in ["big.bin", "small/s05", "small/twin-b"] {
        flip_byte(&src.join(name), 50);
    }
    // Past the moments after a change in which the engine reads a file itself.
    std::thread::sleep(std::time::Duration::from_millis(50));
    let db = t.path("state.db");
    let j = intact!("protect", "--json", "--state", &db, &src)
        .expect_code(1)
        .json();
    for name in ["big.bin", "s05", "twin-b"] {
        assert_eq!(j.status(name), "corrupt", "{}", j.file(name));
        assert_eq!(j.file(name)["action"], "kept");
    }
    // Its other name carries the same damage.
    assert_eq!(
        j.status("other-name.bin"),
        "corrupt",
        "{}",
        j.file("other-name.bin")
    );
    for name in ["s00", "s29", "twin-a"] {
        assert_eq!(j.status(name), "ok", "{}", j.file(name));
        assert_eq!(j.file(name)["copy"], "protected");
    }
    // One pack for the small files; none for the damaged big one.
    assert_eq!(index_files(&src.join(".intact-parity")).len(), 1);
    let status = intact!("status", "--json", "--state", &db, &src)
        .expect_code(1)
        .stdout;
    let v: serde_json::Value = serde_json::from_str(status.trim()).unwrap();
    assert_eq!(v["never_verified"], 3, "{v}");
}

/// A sparse file repaired from parity (which gives every zero as data) comes back sparse, as
/// it comes back from an archive.
#[test]
fn a_sparse_file_repaired_from_parity_stays_sparse() {
    use std::io::{Seek, SeekFrom, Write};
    use std::os::unix::fs::MetadataExt;
    let t = Tree::new();
    let img = t.path("tree/disk.img");
    fs::create_dir_all(img.parent().unwrap()).unwrap();
    let mut f = fs::File::create(&img).unwrap();
    f.write_all(&data(512 << 10, 3)).unwrap();
    f.seek(SeekFrom::Start(12 << 20)).unwrap();
    f.write_all(&data(512 << 10, 4)).unwrap();
    f.set_len(16 << 20).unwrap();
    drop(f);
    let good = fs::read(&img).unwrap();
    intact!("tag", "-q", t.path("tree")).expect_code(0);
    intact!("protect", "-q", "--no-state", t.path("tree")).expect_code(0);
    flip_byte(&img, 100);
    let r = intact!("repair", "--no-state", "--discard-damaged", t.path("tree")).expect_code(0);
    assert!(r.stdout.contains("restored from parity"), "{}", r.stdout);
    assert_eq!(fs::read(&img).unwrap(), good);
    let on_disk = fs::metadata(&img).unwrap().blocks() * 512;
    assert!(
        on_disk < 2 << 20,
        "{on_disk} bytes on disk for 1 MiB of data"
    );
}

/// Bytes of the files under `dir`, recursively.
fn bytes_under(dir: &Path) -> u64 {
    fs::read_dir(dir).map_or(0, |entries| {
        entries
            .map(|e| e.unwrap())
            .map(|e| {
                if e.file_type().unwrap().is_dir() {
                    bytes_under(&e.path())
                } else {
                    e.metadata().unwrap().len()
                }
            })
            .sum()
    })
}

/// Parity follows the tree: after edits and a deletion, `protect` moves the old sets aside
/// (where par2 does not take them for a set), packs the unchanged members of an old pack
/// again, and every set left in the store verifies against the tree as it is now with
/// par2cmdline (an old set would "repair" an edit back). Stale sets go after the grace
/// period, except one that can repair a damaged file.
#[test]
fn parity_follows_the_tree_and_stale_sets_go_after_their_grace() {
    let t = Tree::new();
    let src = tree(&t);
    let store = src.join(".intact-parity");
    intact!("protect", "-q", &src).expect_code(0);
    let first = bytes_under(&store);
    // An edit of the large file, one of a small one, a deletion.
    t.write("src/big.bin", data(1_500_000, 2));
    t.write("src/small/s03", b"edited since");
    fs::remove_file(src.join("small/s05")).unwrap();
    intact!("update", "-q", &src).expect_code(0);
    // `status` counts what the store holds now: the edited files' new content has none.
    let parity = || {
        let r = intact!("status", "--json", &src).expect_code(0);
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        let p = &v["overview"]["parity"];
        (p["current"]["files"].as_u64(), p["none"]["files"].as_u64())
    };
    assert_eq!(parity(), (Some(28), Some(2)));
    let r = intact!("protect", &src).expect_code(0);
    assert_eq!(parity(), (Some(30), Some(0)));
    assert!(
        r.stderr.contains("2 stale set(s) moved aside"),
        "{}",
        r.stderr
    );
    assert!(r.stderr.contains("28 file(s) packed again"), "{}", r.stderr);
    let stale: Vec<_> = fs::read_dir(stale_today(&store).join("packs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !stale.is_empty() && stale.iter().all(|n| n.ends_with(".stale")),
        "{stale:?}"
    );
    let sets = index_files(&store);
    assert_eq!(sets.len(), 3, "the new large set, two packs: {sets:?}");
    for set in &sets {
        verifies(&src, set);
    }
    let live = bytes_under(&store) - bytes_under(&store.join("stale"));
    assert!(
        live < first * 3 / 2,
        "the store follows the tree: {live} bytes against {first} at first"
    );
    // A damaged file: the stale pack holding its content stays past the grace period.
    flip_byte(&src.join("small/s10"), 5);
    let r = intact!("protect", "--keep-stale", "0s", &src).expect_code(1);
    assert!(r.stderr.contains("kept past that"), "{}", r.stderr);
    assert!(!store.join("stale/sha256-").exists());
    assert!(
        fs::read_dir(stale_today(&store).join("packs"))
            .unwrap()
            .count()
            > 0
    );
    intact!("repair", "-q", "--discard-damaged", &src).expect_code(0);
    intact!("protect", "-q", "--keep-stale", "0s", &src).expect_code(0);
    assert!(!store.join("stale").exists(), "all stale parity removed");
    for set in index_files(&store) {
        verifies(&src, &set);
    }
}

/// par2cmdline finds a set's files by the names the set records. After files moved, a
/// protect of the whole tree renames a large file's set (every packet written again, the
/// recovery data kept: no data read) and writes a pack with a moved member again, so `par2
/// verify` and `par2 repair` work on every set; a copy left at the recorded name keeps it.
#[test]
fn sets_follow_their_files_when_they_move() {
    let t = Tree::new();
    let src = tree(&t);
    let store = src.join(".intact-parity");
    t.write("src/copy-of-big.bin", data(1_500_000, 1));
    intact!("protect", "-q", &src).expect_code(0);
    let volumes = |dir: &Path| -> Vec<u64> {
        let mut v: Vec<u64> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().contains(".vol"))
            .map(|p| fs::metadata(p).unwrap().len())
            .collect();
        v.sort();
        v
    };
    let big_set = index_files(&store)
        .into_iter()
        .find(|s| !s.starts_with(store.join("packs")))
        .unwrap();
    let before = volumes(big_set.parent().unwrap());
    fs::create_dir(src.join("album")).unwrap();
    // Whichever name the set took, the copy at the other keeps it: both moved, it follows.
    for (from, to) in [
        ("big.bin", "album/beach.bin"),
        ("copy-of-big.bin", "album/sea.bin"),
    ] {
        fs::rename(src.join(from), src.join(to)).unwrap();
    }
    fs::rename(src.join("small/s07"), src.join("album/s07-moved")).unwrap();
    // status says which files par2cmdline would not find in their pack (from the pack
    // indexes: no data read).
    let misnamed = || {
        let r = intact!("status", "--json", &src).expect_code(0);
        let v: serde_json::Value = serde_json::from_str(r.stdout.lines().last().unwrap()).unwrap();
        v["overview"]["parity"]["misnamed"]["files"].as_u64()
    };
    assert_eq!(misnamed(), Some(1));
    let text = intact!("status", &src).expect_code(0).stdout;
    assert!(
        text.contains("1 file in packs that name them by an old path (moved since)"),
        "{text}"
    );
    let r = intact!("protect", &src).expect_code(0);
    assert!(
        r.stderr
            .contains("1 parity set(s) renamed after their files, which moved"),
        "{}",
        r.stderr
    );
    assert!(
        r.stderr.contains("1 pack(s) written again: members moved"),
        "{}",
        r.stderr
    );
    assert_eq!(misnamed(), Some(0));
    // The same volumes, renamed in place (their descriptions name the new path: a few
    // bytes more or less).
    let after = volumes(big_set.parent().unwrap());
    assert_eq!(after.len(), before.len());
    assert!(after[0].abs_diff(before[0]) < 64, "{before:?} {after:?}");
    let sets = index_files(&store);
    assert_eq!(sets.len(), 2, "{sets:?}");
    for set in &sets {
        verifies(&src, set);
    }
    // par2cmdline repairs the moved files where they are now.
    let beach = src.join("album/beach.bin");
    let good = fs::read(&beach).unwrap();
    flip_byte(&beach, 1_000_000);
    let moved_small = src.join("album/s07-moved");
    let good_small = fs::read(&moved_small).unwrap();
    flip_byte(&moved_small, 10);
    for set in &sets {
        repairs(&src, set);
    }
    assert_eq!(fs::read(&beach).unwrap(), good);
    assert_eq!(fs::read(&moved_small).unwrap(), good_small);
    // Nothing moved since: nothing renamed or written again (par2cmdline kept the
    // damaged files as `NAME.1`, and wrote the repaired ones without their tags).
    fs::remove_file(src.join("album/beach.bin.1")).unwrap();
    fs::remove_file(src.join("album/s07-moved.1")).unwrap();
    let r = intact!("protect", &src).expect_code(0);
    assert!(!r.stderr.contains("renamed after"), "{}", r.stderr);
    assert!(!r.stderr.contains("written again"), "{}", r.stderr);
}

/// A repair or status of a subfolder uses its tree's parity store above it: a file deleted
/// and a file damaged under the subfolder come back from it, and status counts its sets.
#[test]
fn a_subfolder_is_repaired_from_its_trees_store() {
    let t = Tree::new();
    let src = tree(&t);
    intact!("protect", "-q", &src).expect_code(0);
    let sub = src.join("small");
    let (gone, damaged) = (sub.join("s07"), sub.join("s03"));
    let (good_gone, good_damaged) = (fs::read(&gone).unwrap(), fs::read(&damaged).unwrap());
    intact!("scrub", "-q", &src).expect_code(0);
    fs::remove_file(&gone).unwrap();
    flip_byte(&damaged, 5);
    cmd!("check", "-q", &sub).run().expect_code(1);
    let r = intact!("status", "--json", &sub).expect_code(1);
    let v: serde_json::Value = serde_json::from_str(r.stdout.lines().last().unwrap()).unwrap();
    assert!(
        v["overview"]["parity"]["current"]["files"].as_u64() > Some(0),
        "{v}"
    );
    let r = intact!("repair", "--missing", &sub).expect_code(0);
    assert_eq!(fs::read(&gone).unwrap(), good_gone, "{}", r.stdout);
    assert_eq!(fs::read(&damaged).unwrap(), good_damaged, "{}", r.stdout);
    assert!(r.stdout.contains("restored from parity"), "{}", r.stdout);
}

/// A deleted small file comes back from its pack after the pack was moved aside (a stale
/// set is still a source for intact's repair, which verifies what it rebuilds by digest),
/// and a pack with a damaged member is left as it is until that is repaired.
#[test]
fn a_deleted_file_comes_back_from_its_stale_pack() {
    let t = Tree::new();
    let src = tree(&t);
    let store = src.join(".intact-parity");
    intact!("protect", "-q", &src).expect_code(0);
    let gone = src.join("small/s07");
    let good = fs::read(&gone).unwrap();
    fs::remove_file(&gone).unwrap();
    let r = intact!("protect", &src).expect_code(0);
    assert!(
        r.stderr.contains("1 stale set(s) moved aside"),
        "{}",
        r.stderr
    );
    let r = intact!("repair", "--missing", &src).expect_code(0);
    assert_eq!(fs::read(&gone).unwrap(), good, "{}", r.stdout);
    // Only the pack moved aside holds its content.
    assert!(r.stdout.contains("restored from parity"), "{}", r.stdout);
    // A member damaged, another edited: the pack stays until the damage is repaired.
    let packs = || {
        let mut p: Vec<_> = fs::read_dir(store.join("packs"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        p.sort();
        p
    };
    intact!("protect", "-q", &src).expect_code(0);
    let before = packs();
    flip_byte(&src.join("small/s11"), 3);
    t.write("src/small/s12", b"an edit");
    intact!("update", "-q", src.join("small/s12")).expect_code(0);
    intact!("protect", "-q", &src).expect_code(1);
    assert!(
        before.iter().all(|p| packs().contains(p)),
        "a pack with a damaged member was moved aside"
    );
    intact!("repair", "-q", "--discard-damaged", &src).expect_code(0);
    intact!("protect", "-q", &src).expect_code(0);
    assert!(
        !before.iter().all(|p| packs().contains(p)),
        "the pack with an edited member stays once the damage is repaired"
    );
}

/// A pack moved aside keeps only the recovery slices that rebuild its members gone from the
/// tree (as many as their slices): the rest would cost the store as much again for the
/// month it is kept. A pack with more gone than it rebuilds is removed.
#[test]
fn a_stale_pack_keeps_only_what_rebuilds_its_gone_members() {
    let t = Tree::new();
    let src = tree(&t);
    let store = src.join(".intact-parity");
    // Each volume's recovery slices, from its name (`ID.vol00+R.par2`).
    let volumes = |dir: &Path| -> Vec<(u32, u64)> {
        let mut v: Vec<(u32, u64)> = fs::read_dir(dir)
            .map(|d| d.map(|e| e.unwrap()).collect::<Vec<_>>())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let r = name
                    .split_once(".vol00+")?
                    .1
                    .split('.')
                    .next()?
                    .parse()
                    .ok()?;
                Some((r, e.metadata().unwrap().len()))
            })
            .collect();
        v.sort();
        v
    };
    intact!("protect", "-q", &src).expect_code(0);
    let [(recovery, bytes)] = volumes(&store.join("packs"))[..] else {
        panic!("one pack: {:?}", volumes(&store.join("packs")));
    };
    assert!(recovery > 1, "{recovery}");
    fs::remove_file(src.join("small/s07")).unwrap();
    intact!("protect", "-q", &src).expect_code(0);
    let [(kept, stale_bytes)] = volumes(&stale_today(&store).join("packs"))[..] else {
        panic!(
            "one stale pack: {:?}",
            volumes(&stale_today(&store).join("packs"))
        );
    };
    assert!(kept >= 1 && kept < recovery, "{kept} of {recovery}");
    assert!(stale_bytes < bytes, "{stale_bytes} against {bytes}");
    // Ten members of the new pack gone at once: more slices than its recovery slices.
    for i in 20..30 {
        fs::remove_file(src.join(format!("small/s{i:02}"))).unwrap();
    }
    let r = intact!("protect", &src).expect_code(0);
    assert!(
        r.stderr
            .contains("1 pack(s) removed: more of their members are gone"),
        "{}",
        r.stderr
    );
    assert_eq!(volumes(&stale_today(&store).join("packs")).len(), 1);
}

/// The nightly scrub protects what it tags: `scrub --update --protect` gives new and edited
/// files parity the night they appear (repaired from it alone the next day), costs nothing
/// for files whose content has parity, and moves aside the pack of content it saw edited
/// away (its other members packed again), so that every set left describes the tree.
#[test]
fn the_nightly_scrub_protects_new_and_edited_files() {
    let t = Tree::new();
    let src = tree(&t);
    let db = t.path("state.db");
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    let nightly = || nightly_protect(&db, &src);
    let r = nightly();
    assert_eq!(r.summary["actions"]["protected"], 31, "{}", r.summary);
    let sets = index_files(&src.join(".intact-parity"));
    // A new large file, a new small one, an edit.
    let big = t.write("src/new/big.bin", data(600_000, 50));
    let small = t.write("src/new/small", data(3_000, 51));
    t.write("src/small/s04", b"edited tonight");
    let r = nightly();
    for name in ["new/big.bin", "new/small", "small/s04"] {
        let f = r.file(name);
        assert_eq!(f["copy"], "protected", "{name}: {f:?}");
        assert_eq!(f["action"], "tagged", "{name}: {f:?}");
    }
    assert!(index_files(&src.join(".intact-parity")).len() > sets.len());
    // The pack of s04's old content is taken apart: its other members are packed again, and
    // nothing of it is kept (nothing in it is wanted back).
    assert!(
        !src.join(".intact-parity/stale").exists(),
        "the pack of s04's old content was kept"
    );
    for set in index_files(&src.join(".intact-parity")) {
        verifies(&src, &set);
    }
    let good = [
        (big.clone(), fs::read(&big).unwrap()),
        (small.clone(), fs::read(&small).unwrap()),
    ];
    flip_byte(&big, 100_000);
    flip_byte(&small, 10);
    intact!("repair", "-q", "--discard-damaged", "--full", &src).expect_code(0);
    for (p, bytes) in good {
        assert_eq!(fs::read(&p).unwrap(), bytes, "{}", p.display());
    }
}

/// What is moved aside today, in the store `store` (`stale/DAY`).
fn stale_today(store: &Path) -> std::path::PathBuf {
    let day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 86_400;
    store.join("stale").join(day.to_string())
}

/// A day passes for what was moved aside into `stale` (its folders are days: each is named a
/// day earlier).
fn age_by_a_day(stale: &Path) {
    let mut days: Vec<u64> = fs::read_dir(stale)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    days.sort();
    for day in days {
        let (from, to) = (
            stale.join(day.to_string()),
            stale.join((day - 1).to_string()),
        );
        if !to.exists() {
            fs::rename(&from, &to).unwrap();
            continue;
        }
        for sub in fs::read_dir(&from).unwrap().flatten() {
            let dest = to.join(sub.file_name());
            fs::create_dir_all(&dest).unwrap();
            for f in fs::read_dir(sub.path()).unwrap().flatten() {
                fs::rename(f.path(), dest.join(f.file_name())).unwrap();
            }
            fs::remove_dir(sub.path()).unwrap();
        }
        fs::remove_dir(&from).unwrap();
    }
}

/// Parity over years of changes (issue: parity that stays current): a seeded tree of 160
/// files lives 200 simulated nights (each night 2% of its files edited, 1% added, 1%
/// deleted, 1% moved; what was moved aside ages a day a night), with a nightly `protect`. Every night, every file has current parity
/// (protected the night it appears), the store's current sets cost at most 1.2 times what
/// protecting the live tree afresh costs, and every twentieth night (a quiet one) bytes
/// flipped in three files are repaired from parity alone. The nightly times are printed (`--nocapture`), not
/// asserted.
#[test]
fn two_hundred_nights_of_changes_keep_parity_current_and_the_store_bounded() {
    let t = Tree::new();
    let src = t.path("src");
    let db = t.path("state.db");
    let mut rng = fastrand::Rng::with_seed(2026);
    let mut seed = 1000u64;
    let mut content = |rng: &mut fastrand::Rng| {
        seed += 1;
        // One file in five large enough for a set of its own.
        let len = if rng.u8(0..5) == 0 {
            rng.usize(300_000..900_000)
        } else {
            rng.usize(20_000..200_000)
        };
        data(len, seed)
    };
    let mut files: Vec<String> = Vec::new();
    let mut next = 0;
    let mut name = |rng: &mut fastrand::Rng| {
        next += 1;
        format!("d{}/f{next:05}", rng.u8(0..8))
    };
    for _ in 0..160 {
        let n = name(&mut rng);
        t.write(format!("src/{n}"), content(&mut rng));
        files.push(n);
    }
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    // The store against the live data it protects.
    let share = |p: &serde_json::Value| {
        p["store_bytes"].as_u64().unwrap() as f64 / p["current"]["bytes"].as_u64().unwrap() as f64
    };
    let r = intact!("status", "--json", "--no-state", &src).expect_code(0);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    // What protecting the tree once costs at 10% (packs pad members to a common slice).
    let fresh = share(&v["overview"]["parity"]);
    let mut times = Vec::new();
    let (mut worst, mut stale): (f64, f64) = (0.0, 0.0);
    for night in 1..=200 {
        // Every twentieth night is quiet but for bit rot: a pack rebuilds a damaged member
        // only while its other members are as it describes them (changes since the last
        // protect count as damage too).
        let rot = night % 20 == 0;
        let n = files.len() as f64;
        let count = |share: f64| match rot {
            true => 0,
            false => ((n * share).round() as usize).max(1),
        };
        for _ in 0..count(0.02) {
            let f = &files[rng.usize(0..files.len())];
            t.write(format!("src/{f}"), content(&mut rng));
        }
        for _ in 0..count(0.01) {
            let n = name(&mut rng);
            t.write(format!("src/{n}"), content(&mut rng));
            files.push(n);
        }
        for _ in 0..count(0.01) {
            let f = files.swap_remove(rng.usize(0..files.len()));
            fs::remove_file(src.join(f)).unwrap();
        }
        for _ in 0..count(0.01) {
            let k = rng.usize(0..files.len());
            let n = name(&mut rng);
            fs::create_dir_all(src.join(&n).parent().unwrap()).unwrap();
            fs::rename(src.join(&files[k]), src.join(&n)).unwrap();
            files[k] = n;
        }
        let mut flipped = Vec::new();
        if rot {
            for _ in 0..3 {
                let f = src.join(&files[rng.usize(0..files.len())]);
                if !flipped.iter().any(|(p, _)| *p == f) {
                    flipped.push((f.clone(), fs::read(&f).unwrap()));
                    flip_byte(&f, 1_000);
                }
            }
        }
        let start = std::time::Instant::now();
        intact!("protect", "-q", "--state", &db, &src).expect_code(if flipped.is_empty() {
            0
        } else {
            1
        });
        times.push(start.elapsed().as_secs_f64());
        if !flipped.is_empty() {
            intact!("repair", "-q", "--discard-damaged", "--state", &db, &src).expect_code(0);
            for (p, good) in &flipped {
                assert!(
                    &fs::read(p).unwrap() == good,
                    "night {night}: {}",
                    p.display()
                );
            }
        }
        // A night passes for what was moved aside (its grace period counts in days).
        age_by_a_day(&src.join(".intact-parity/stale"));
        let r = intact!("status", "--json", "--no-state", &src).expect_code(0);
        let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
        let p = &v["overview"]["parity"];
        assert_eq!(p["none"]["files"], 0, "night {night}: {p}");
        assert_eq!(
            p["current"]["files"],
            files.len() as u64,
            "night {night}: {p}"
        );
        stale = stale.max(
            p["stale_bytes"].as_u64().unwrap() as f64 / p["store_bytes"].as_u64().unwrap() as f64,
        );
        // The current sets cost at most 1.2 times what protecting the live tree afresh costs.
        let ratio = share(p) / fresh;
        worst = worst.max(ratio);
        assert!(
            ratio <= 1.2,
            "night {night}: the store is {ratio:.2} times a fresh one's share: {p}"
        );
    }
    let windows: Vec<String> = times
        .chunks(40)
        .map(|w| format!("{:.3}", w.iter().sum::<f64>() / w.len() as f64))
        .collect();
    eprintln!(
        "nightly protect, mean seconds by 40 nights: {}",
        windows.join(", ")
    );
    let first: f64 = times[..20].iter().sum::<f64>() / 20.0;
    let last: f64 = times[180..].iter().sum::<f64>() / 20.0;
    eprintln!(
        "200 nights: nightly protect {first:.3} s (nights 1-20) -> {last:.3} s (181-200); \
         store {:.1}% of the data when fresh, at most {worst:.2} times that; what was moved \
         aside at most {stale:.2} times the current sets",
        fresh * 100.0
    );
    // Kept for the month a deletion is remembered, what was moved aside is about the
    // deleted data itself (what rebuilds it); whole packs kept were 7 times the current sets.
    assert!(
        stale < 5.0,
        "what was moved aside: {stale:.2} times the current sets"
    );
}

/// The night a member of a pack is edited, `scrub --update --protect` packs its other members
/// again and keeps nothing it does not need: no stale copy of the pack where every member
/// has parity again; where a member was not found (moved away), only as many recovery slices
/// as that member has. Every set left verifies with par2cmdline.
#[test]
fn an_edit_repacks_its_pack_the_same_night_and_keeps_only_what_it_needs() {
    let t = Tree::new();
    for i in 0..200 {
        t.write(format!("src/f{i:03}"), data(16_000, i));
    }
    let src = t.path("src");
    let db = t.path("state.db");
    intact!("tag", "-q", &src).expect_code(0);
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    let store = src.join(".intact-parity");
    let pack_bytes = dir_bytes(&store.join("packs"));
    let nightly = || nightly_protect(&db, &src);
    t.write("src/f050", data(16_000, 1050));
    let r = nightly();
    assert_eq!(r.summary["actions"]["protected"], 200, "{}", r.summary);
    assert!(!store.join("stale").exists(), "a stale pack kept");
    for set in index_files(&store) {
        verifies(&src, &set);
    }
    // A member moved away where the scrub does not look, then an edit of another.
    fs::create_dir(src.join("away")).unwrap();
    fs::rename(src.join("f010"), src.join("away/f010")).unwrap();
    t.write("src/f020", data(16_000, 1020));
    nightly();
    let stale = dir_bytes(&store.join("stale"));
    assert!(stale > 0, "the moved member's slices were not kept");
    assert!(
        stale * 2 < pack_bytes,
        "{stale} bytes kept aside of a pack of {pack_bytes}"
    );
    // Its volume holds the one recovery slice the moved member needs (beside the index).
    let volumes: Vec<String> = fs::read_dir(stale_today(&store).join("packs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".vol"))
        .collect();
    assert!(
        volumes.len() == 1 && volumes[0].contains("vol00+01."),
        "{volumes:?}"
    );
    for set in index_files(&store) {
        verifies(&src, &set);
    }
    let v: serde_json::Value = serde_json::from_str(
        intact!("status", "--json", "--state", &db, &src)
            .expect_code(0)
            .stdout
            .trim(),
    )
    .unwrap();
    assert_eq!(v["overview"]["parity"]["current"]["files"], 199, "{v}");
}

/// Bytes of the files under `dir` (none if it does not exist).
fn dir_bytes(dir: &Path) -> u64 {
    let mut n = 0;
    for e in fs::read_dir(dir).into_iter().flatten().flatten() {
        let m = e.metadata().unwrap();
        n += if m.is_dir() {
            dir_bytes(&e.path())
        } else {
            m.len()
        };
    }
    n
}

/// Files gone at once (60 of 100: a folder deleted by mistake) are an alarm until the owner
/// confirms them: `protect` keeps their parity whole (the one copy that could undo the
/// mistake) and exits 3 as the scrub does; once confirmed (`scrub --accept-removed`) it
/// prunes. Without a state database it cannot tell a deletion from a missing disk, and
/// prunes nothing.
#[test]
fn a_mass_deletion_not_confirmed_keeps_its_parity() {
    let t = Tree::new();
    for i in 0..100 {
        t.write(format!("src/f{i:03}"), data(3_000, i));
    }
    let src = t.path("src");
    let db = t.path("state.db");
    intact!("tag", "-q", &src).expect_code(0);
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    intact!("scrub", "-q", "--state", &db, &src).expect_code(0);
    let store = src.join(".intact-parity");
    let before = index_files(&store);
    for i in 0..60 {
        fs::remove_file(src.join(format!("f{i:03}"))).unwrap();
    }
    intact!("scrub", "-q", "--state", &db, &src).expect_code(3);
    let r = intact!("protect", "--state", &db, &src).expect_code(3);
    assert!(r.stderr.contains("60 of the 100 files"), "{}", r.stderr);
    assert_eq!(index_files(&store), before, "parity pruned");
    assert!(!store.join("stale").exists());
    let r = intact!("protect", "--no-state", &src).expect_code(0);
    assert!(
        r.stderr.contains("no stale parity was moved aside"),
        "{}",
        r.stderr
    );
    assert_eq!(
        index_files(&store),
        before,
        "parity pruned without a database"
    );
    intact!("scrub", "-q", "--state", &db, "--accept-removed", &src).expect_code(0);
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    assert_ne!(index_files(&store), before, "not pruned once confirmed");
    for set in index_files(&store) {
        verifies(&src, &set);
    }
}

/// When a set was moved aside is its day folder's name, not its files' mtimes (anyone who can
/// write the store can set an mtime): a stale set dated back to 1970 stays its grace; a day
/// folder 40 days old is removed.
#[test]
fn the_grace_of_stale_parity_counts_from_the_day_it_was_moved_aside() {
    let t = Tree::new();
    let src = t.path("src");
    t.write("src/big.bin", data(600_000, 1));
    let db = t.path("state.db");
    intact!("tag", "-q", &src).expect_code(0);
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    t.write("src/big.bin", data(600_000, 2));
    intact!("update", "-q", "--state", &db, &src).expect_code(0);
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    let store = src.join(".intact-parity");
    let today = stale_today(&store);
    assert!(today.exists(), "nothing moved aside");
    for dir in fs::read_dir(&today).unwrap().flatten() {
        for f in fs::read_dir(dir.path()).unwrap().flatten() {
            let f = fs::File::options().write(true).open(f.path()).unwrap();
            f.set_modified(std::time::UNIX_EPOCH).unwrap();
        }
    }
    intact!("protect", "-q", "--state", &db, &src).expect_code(0);
    assert!(today.exists(), "removed by its mtime");
    for _ in 0..40 {
        age_by_a_day(&store.join("stale"));
    }
    let r = intact!("protect", "--state", &db, &src).expect_code(0);
    assert!(r.stderr.contains("stale file(s)"), "{}", r.stderr);
    assert!(
        !store.join("stale").exists() || fs::read_dir(store.join("stale")).unwrap().count() == 0
    );
}

/// The nightly unit's `scrub --update --protect` of `src`, which finds nothing wrong.
fn nightly_protect(db: &Path, src: &Path) -> Json {
    intact!(
        "scrub",
        "--json",
        "--state",
        db,
        "--update",
        "--protect",
        src
    )
    .expect_code(0)
    .json()
}

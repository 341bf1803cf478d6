//! Repair from the backups people already have, with the real tools: a restic repository, a
//! borg repository, and any command that prints a file. Damage of every kind (a file moved
//! since the backup, one whose newest backup copied the rot, one with two hard links, one
//! whose name is not UTF-8) comes back bit for bit, with its tag and its mtime; a wrong
//! password or a missing tool is one clear error, and the other sources are still tried.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::*;

/// A tagged tree under `t/src`: the files' names and their good bytes.
fn tree(t: &Tree) -> Vec<(PathBuf, Vec<u8>)> {
    let odd = t.path("src").join(OsStr::from_bytes(b"caf\xe9.jpg"));
    let files = vec![
        (t.path("src/photo.jpg"), data(200_000, 1)),
        (t.path("src/moved.jpg"), data(150_000, 2)),
        (t.path("src/twice.jpg"), data(120_000, 3)),
        (t.path("src/linked.jpg"), data(90_000, 4)),
        (odd, data(60_000, 5)),
    ];
    for (p, bytes) in &files {
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, bytes).unwrap();
    }
    fs::hard_link(t.path("src/linked.jpg"), t.path("src/second-name.jpg")).unwrap();
    intact!("tag", "-q", t.path("src")).expect_code(0);
    files
}

/// A copy of `t/src` made with `cp -a` (xattrs, times and hard links kept) at `t/name`.
fn copy_of_src(t: &Tree, name: &str) -> PathBuf {
    let copy = t.path(name);
    copy_tree(&t.path("src"), &copy);
    copy
}

/// A new restic repository at `t/restic-repo` with `password`: its path, and `restic` aimed
/// at it.
fn restic_repo(t: &Tree, password: &'static str) -> (PathBuf, impl Fn() -> Command) {
    let repo = t.path("restic-repo");
    let at = repo.clone();
    let restic = move || {
        let mut c = Command::new("restic");
        c.env("RESTIC_PASSWORD", password).arg("--repo").arg(&at);
        c
    };
    run(restic().args(["init", "-q"]));
    (repo, restic)
}

fn run(cmd: &mut Command) {
    let out = cmd
        .output()
        .expect("the backup tool is installed (.ci/run installs it)");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Two backups, the second taken after `twice.jpg` rotted; then damage everywhere (and
/// `moved.jpg` moved). Returns the files as they should be, at their paths now.
fn back_up_and_damage(
    t: &Tree,
    files: &[(PathBuf, Vec<u8>)],
    mut backup: impl FnMut(),
) -> Vec<(PathBuf, Vec<u8>)> {
    backup();
    flip_byte(&t.path("src/twice.jpg"), 77);
    // The rot backed up twice: it entered the backups with the first of these.
    backup();
    backup();
    let moved = t.path("src/elsewhere/moved-since.jpg");
    fs::create_dir_all(moved.parent().unwrap()).unwrap();
    fs::rename(t.path("src/moved.jpg"), &moved).unwrap();
    let mut now: Vec<(PathBuf, Vec<u8>)> = files.to_vec();
    now[1].0 = moved;
    for (p, _) in &now {
        flip_byte(p, 1_000);
    }
    now
}

/// Every file is its good bytes again, with its tag (the same value as before) and mtime;
/// the two names of the hard-linked file are still one file.
fn all_good(t: &Tree, now: &[(PathBuf, Vec<u8>)], tags: &[Vec<u8>], mtimes: &[(i64, i64)]) {
    for (k, (p, bytes)) in now.iter().enumerate() {
        assert_eq!(&fs::read(p).unwrap(), bytes, "{}", p.display());
        assert_eq!(getxattr(p, TAG).as_ref(), Some(&tags[k]), "{}", p.display());
        assert_eq!(mtime(p), mtimes[k], "{}", p.display());
    }
    let (a, b) = (
        fs::metadata(t.path("src/linked.jpg")).unwrap(),
        fs::metadata(t.path("src/second-name.jpg")).unwrap(),
    );
    assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "the hard link kept");
    intact!("check", "-q", "--no-state", t.path("src")).expect_code(0);
}

fn before(files: &[(PathBuf, Vec<u8>)]) -> (Vec<Vec<u8>>, Vec<(i64, i64)>) {
    (
        files
            .iter()
            .map(|(p, _)| getxattr(p, TAG).unwrap())
            .collect(),
        files.iter().map(|(p, _)| mtime(p)).collect(),
    )
}

/// What `repair` said of the file whose name ends with `name`.
fn said<'a>(r: &'a Run, name: &str) -> &'a str {
    r.stdout
        .lines()
        .find(|l| l.split(':').next().is_some_and(|p| p.ends_with(name)))
        .unwrap_or_else(|| panic!("no line for {name}: {}", r.stdout))
}

/// A backup tool's new repository in a test's tree: how `--from` names it, what a run of
/// intact needs in its environment to read it, and how to back up a folder into it.
struct Repo<'a> {
    from: String,
    dir: PathBuf,
    env: Vec<(&'static str, std::ffi::OsString)>,
    /// The variable that holds its password.
    password: &'static str,
    /// Backs up a folder (an absolute path): a new snapshot or archive each time.
    backup: Box<dyn FnMut(&std::path::Path) + 'a>,
}

impl Repo<'_> {
    /// `intact ARGS` with the environment the repository needs.
    fn intact(&self, args: &[&OsStr]) -> Cmd {
        let mut c = cmd!().args(args);
        for (k, v) in &self.env {
            c = c.env(k, v);
        }
        c
    }
}

/// A new repository of `tool` (restic or borg) in `t`, with the password "pw".
fn repository<'a>(t: &'a Tree, tool: &'static str) -> Repo<'a> {
    match tool {
        "restic" => {
            let (dir, restic) = restic_repo(t, "pw");
            Repo {
                from: format!("restic:{}", dir.display()),
                dir,
                env: vec![("RESTIC_PASSWORD", "pw".into())],
                password: "RESTIC_PASSWORD",
                backup: Box::new(move |folder| {
                    run(restic().args(["backup", "-q", "--force"]).arg(folder))
                }),
            }
        }
        _ => {
            let dir = t.path("borg-repo");
            let env = vec![
                ("BORG_PASSPHRASE", "pw".into()),
                ("BORG_BASE_DIR", t.path("borg-home").into_os_string()),
            ];
            let borg = {
                let env = env.clone();
                move || {
                    let mut c = Command::new("borg");
                    c.envs(env.iter().map(|(k, v)| (k, v)));
                    c
                }
            };
            run(borg().args(["init", "-e", "repokey"]).arg(&dir));
            let (mut n, at) = (0, dir.clone());
            Repo {
                from: format!("borg:{}", dir.display()),
                dir,
                env,
                password: "BORG_PASSPHRASE",
                // Absolute paths: borg keeps them (less the leading slash). Archives n1, n2 ...
                backup: Box::new(move |folder| {
                    n += 1;
                    run(borg()
                        .args(["create", "--files-cache=disabled"])
                        .arg(format!("{}::n{n}", at.display()))
                        .arg(folder))
                }),
            }
        }
    }
}

/// Repair from restic and from borg, one scenario for both: every kind of damage comes back
/// bit for bit with its tag and mtime, a newest version that copied the rot is passed over
/// and said, a file moved since the backup is found at its old path, nothing is written into
/// the repository; a wrong password is one clear error naming the source while the other
/// sources still serve, and a missing tool is said.
#[test]
fn repair_from_restic_and_borg_repositories() {
    for tool in ["restic", "borg"] {
        let t = Tree::new();
        let files = tree(&t);
        let (tags, mtimes) = before(&files);
        let mirror = copy_of_src(&t, "mirror");
        let mut repo = repository(&t, tool);
        let now = back_up_and_damage(&t, &files, || (repo.backup)(&t.path("src")));
        let src = t.path("src");
        let repair = [
            "repair".as_ref(),
            "--no-state".as_ref(),
            "--discard-damaged".as_ref(),
            "--from".as_ref(),
            repo.from.as_ref(),
            src.as_os_str(),
        ];
        let r = repo.intact(&repair).run().expect_code(0);
        all_good(&t, &now, &tags, &mtimes);
        // The newest version copied the rot: said, and an older one used.
        let twice = said(&r, "twice.jpg");
        assert!(
            twice.contains("passed over") && twice.contains("does not match"),
            "{tool}: {twice}"
        );
        // Dated by the oldest version holding the damaged copy, not the newest.
        let entered = match tool {
            "restic" => "nor the same copy in every older version back to snapshot ",
            _ => "nor the same copy in every older version back to archive n2 ",
        };
        assert!(
            twice.contains(entered) && twice.contains("the damage entered the backups by then"),
            "{tool}: {twice}"
        );
        assert!(
            said(&r, "moved-since.jpg").contains("/src/moved.jpg)"),
            "{tool}: {}",
            r.stdout
        );
        match tool {
            // Nothing written into the repository: no lock left.
            "restic" => assert_eq!(fs::read_dir(repo.dir.join("locks")).unwrap().count(), 0),
            // One archive only: the first, taken before the rot.
            _ => {
                flip_byte(&t.path("src/twice.jpg"), 5);
                let one = format!("{}::n1", repo.from);
                let mut args = repair;
                args[4] = one.as_ref();
                let r = repo.intact(&args).run().expect_code(0);
                assert!(said(&r, "twice.jpg").contains("archive n1"), "{}", r.stdout);
            }
        }

        // A wrong password is one clear error naming the source; the others still serve.
        for (p, _) in &now {
            flip_byte(p, 2_000);
        }
        let r = repo
            .intact(&repair)
            .args(["--from".as_ref(), mirror.as_os_str()])
            .env(repo.password, "wrong")
            .run()
            .expect_code(0);
        let photo = said(&r, "photo.jpg");
        assert!(
            photo.contains("restored from") && photo.contains("mirror"),
            "{tool}: {photo}"
        );
        assert!(
            photo.contains(&format!("unusable ({tool} failed (exit status: ")),
            "{tool}: {photo}"
        );
        all_good(&t, &now, &tags, &mtimes);
        // The tool missing: said so.
        flip_byte(&now[0].0, 2_000);
        let empty = t.path("bin");
        fs::create_dir(&empty).unwrap();
        let r = repo
            .intact(&repair)
            .env("PATH", &empty)
            .run()
            .expect_code(1);
        assert!(
            r.stdout.contains(&format!("{tool} is not installed")),
            "{}",
            r.stdout
        );
        // restic without its password (the unit's environment lacks it): a dry run says so
        // as that, not as restic's complaint about a terminal.
        if tool == "restic" {
            let r = repo
                .intact(&repair)
                .arg("--dry-run")
                .env("RESTIC_PASSWORD", "")
                .run()
                .expect_code(1);
            assert!(
                r.stdout.contains(
                    "restic needs the repository's password and none is set here \
                     (RESTIC_PASSWORD_FILE, RESTIC_PASSWORD or RESTIC_PASSWORD_COMMAND"
                ),
                "{}",
                r.stdout
            );
        }
    }
}

#[test]
fn repair_from_any_command_that_prints_a_file() {
    let t = Tree::new();
    let files = tree(&t);
    let (tags, mtimes) = before(&files);
    let copy = copy_of_src(&t, "copy");
    for (p, _) in &files {
        flip_byte(p, 3_000);
    }
    // A command that prints a wrong copy first: it is only a lead, and replaces nothing.
    let wrong = format!("head -c 10 {}/photo.jpg; true {{}}", copy.display());
    let right = format!("cat {}/{{}}", copy.display());
    let r = cmd!(
        "repair",
        "--no-state",
        "--discard-damaged",
        "--from-command",
        &wrong,
        "--from-command",
        &right,
        t.path("src")
    )
    .run()
    .expect_code(0);
    all_good(&t, &files, &tags, &mtimes);
    assert!(
        said(&r, "photo.jpg").contains("passed over"),
        "{}",
        r.stdout
    );
}

/// `--missing` brings back what is gone, from a backup, to its last known path (its
/// directory made again), verified by the digest it had; never over a file that took its
/// name; and without the flag, a deletion is left as the owner's choice.
#[test]
fn repair_brings_back_what_is_gone_when_asked() {
    let t = Tree::new();
    let files = tree(&t);
    let db = t.path("state.db");
    intact!("check", "-q", "--state", &db, t.path("src")).expect_code(0);
    let (repo, restic) = restic_repo(&t, "pw");
    run(restic().args(["backup", "-q"]).arg(t.path("src")));
    let gone = t.path("src/photo.jpg");
    fs::remove_file(&gone).unwrap();
    let odd = &files[4].0;
    fs::remove_file(odd).unwrap();
    // Another file took a name since: it stays.
    fs::write(t.path("src/twice.jpg.tmp"), b"new content").unwrap();
    fs::rename(t.path("src/twice.jpg.tmp"), t.path("src/twice.jpg")).unwrap();
    let from = format!("restic:{}", repo.display());
    let repair = |missing: bool| {
        let mut c = cmd!("repair", "--state", &db, "--from", &from, t.path("src"));
        if missing {
            c = c.arg("--missing");
        }
        c.env("RESTIC_PASSWORD", "pw").run()
    };
    repair(false).expect_code(0);
    assert!(!gone.exists(), "restored without --missing");
    let r = repair(true).expect_code(0);
    for (p, bytes) in [&files[0], &files[4]] {
        assert_eq!(&fs::read(p).unwrap(), bytes, "{}", p.display());
        assert!(getxattr(p, TAG).is_some(), "tagged");
    }
    assert!(
        r.stdout.contains("was missing; restored from restic:"),
        "{}",
        r.stdout
    );
    assert_eq!(fs::read(t.path("src/twice.jpg")).unwrap(), b"new content");
    intact!("check", "-q", "--no-state", t.path("src")).expect_code(0);
    // Gone with its directory: the directory comes back too, beneath the tree.
    fs::create_dir(t.path("src/album")).unwrap();
    let deep = t.path("src/album/deep.jpg");
    fs::write(&deep, data(30_000, 9)).unwrap();
    intact!("tag", "-q", &deep).expect_code(0);
    intact!("check", "-q", "--state", &db, t.path("src")).expect_code(0);
    run(restic().args(["backup", "-q"]).arg(t.path("src")));
    fs::remove_dir_all(t.path("src/album")).unwrap();
    repair(true).expect_code(0);
    assert_eq!(fs::read(&deep).unwrap(), data(30_000, 9));
    // Gone, and in no backup: named, with why, and the repair ends in trouble.
    let unsaved = t.write("src/unsaved.jpg", data(9_000, 10));
    intact!("tag", "-q", "--state", &db, &unsaved).expect_code(0);
    fs::remove_file(&unsaved).unwrap();
    let r = repair(true).expect_code(3);
    assert!(
        said(&r, "unsaved.jpg").starts_with("missing")
            && said(&r, "unsaved.jpg").contains("no good copy found"),
        "{}",
        r.stdout
    );
}

/// A deleted file is remembered whatever happens to its inode (row 1 of the issue): tagged
/// only (no check ever ran), deleted, its inode taken at once by a copy of another file,
/// then a read-only check and a scrub: `repair --missing` still brings it back from restic.
#[test]
fn a_deletion_is_remembered_when_its_inode_is_reused() {
    crate::require_faults!();
    let t = Tree::new();
    // A file system of its own: no other test takes the freed inode first.
    let image = t.path("ext4.img");
    fs::File::create(&image).unwrap().set_len(32 << 20).unwrap();
    let _disk = crate::faultfs::LoopFs::new(&image, &["mkfs.ext4", "-q", "-F"], &t.path("src"));
    let db = t.path("state.db");
    let mut files = Vec::new();
    for i in 0..5u64 {
        let p = t.write(format!("src/f{i}"), data(20_000, 40 + i));
        files.push((p, data(20_000, 40 + i)));
    }
    // `tag` records what it tagged: nothing else ever looks at the tree before the deletion.
    intact!("tag", "-q", "--state", &db, t.path("src")).expect_code(0);
    let (repo, restic) = restic_repo(&t, "pw");
    run(restic().args(["backup", "-q"]).arg(t.path("src")));
    let (gone, good) = files[3].clone();
    let ino = fs::metadata(&gone).unwrap().ino();
    fs::remove_file(&gone).unwrap();
    // ext4 hands a freed inode out again at once: copies take it (a few tries at most).
    let mut reused = None;
    for n in 0..20 {
        let copy = t.path(format!("src/copy{n}"));
        let ok = Command::new("cp")
            .arg("-a")
            .arg(&files[1].0)
            .arg(&copy)
            .status()
            .unwrap();
        assert!(ok.success());
        if fs::metadata(&copy).unwrap().ino() == ino {
            reused = Some(copy);
            break;
        }
    }
    let reused = reused.expect("the file system never reused the deleted file's inode");
    // The copy recorded on that inode (a read-only check), then a scrub: still known gone.
    intact!("check", "-q", "--state", &db, t.path("src")).expect_code(0);
    let r = intact!("scrub", "--state", &db, t.path("src")).expect_code(0);
    assert!(
        r.stdout.contains("removed") && r.stdout.contains("f3"),
        "{}",
        r.stdout
    );
    intact!("check", "-q", "--state", &db, t.path("src")).expect_code(0);
    let r = intact!("status", "--state", &db, t.path("src")).expect_code(0);
    assert!(
        r.stdout.contains("f3"),
        "status forgot the deletion: {}",
        r.stdout
    );
    // A file moved, then edited and re-tagged (its inode keeps moving with it): no deletion.
    let moved = t.path("src/f2-moved");
    fs::rename(&files[2].0, &moved).unwrap();
    let mut edited = files[2].1.clone();
    edited.extend_from_slice(b"an edit");
    fs::write(&moved, &edited).unwrap();
    intact!("update", "-q", "--state", &db, t.path("src")).expect_code(0);
    let r = cmd!(
        "repair",
        "--missing",
        "--state",
        &db,
        "--from",
        format!("restic:{}", repo.display()),
        t.path("src")
    )
    .env("RESTIC_PASSWORD", "pw")
    .run()
    .expect_code(0);
    assert!(r.stdout.contains("was missing; restored"), "{}", r.stdout);
    assert_eq!(fs::read(&gone).unwrap(), good);
    assert_eq!(
        fs::read(&reused).unwrap(),
        files[1].1,
        "the copy is left alone"
    );
    assert!(!files[2].0.exists(), "a moved file's old version came back");
    assert_eq!(fs::read(&moved).unwrap(), edited);
}

/// Every distinct version is within reach (rows 2 and 3 of the issue): the newest seven
/// snapshots of a photo hold its rot (each with a moved ctime, so restic read it again), ten
/// snapshots of another folder are on top, and the good version is the twentieth newest:
/// found, through a listing of the photo's folder only in the older snapshots. A file with no
/// good version anywhere says how many distinct copies were tried, each stored copy once.
#[test]
fn the_good_version_is_found_behind_many_damaged_ones() {
    let t = Tree::new();
    let photo = t.write("src/photo.jpg", data(60_000, 70));
    let hopeless = t.write("src/hopeless.jpg", data(40_000, 71));
    t.write("other/notes.txt", data(1_000, 72));
    intact!("tag", "-q", t.path("src")).expect_code(0);
    let good = fs::read(&photo).unwrap();
    let (repo, restic) = restic_repo(&t, "pw");
    // Rot before any backup: every version of it is damaged.
    flip_byte(&hopeless, 10);
    // The ctime moves (a mode set again): restic reads the file anew each time.
    let ctime_moves = |p: &std::path::Path| {
        let mode = fs::metadata(p).unwrap().permissions();
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::set_permissions(p, mode).unwrap();
    };
    for _ in 0..3 {
        ctime_moves(&hopeless);
        run(restic().args(["backup", "-q"]).arg(t.path("src")));
    }
    flip_byte(&photo, 500);
    for n in 0..7 {
        ctime_moves(&photo);
        if n == 3 {
            flip_byte(&photo, 900);
        }
        run(restic().args(["backup", "-q"]).arg(t.path("src")));
    }
    // Another host's backups of another folder on top.
    for _ in 0..10 {
        ctime_moves(&t.path("other/notes.txt"));
        run(restic()
            .args(["backup", "-q", "--host", "elsewhere"])
            .arg(t.path("other")));
    }
    let from = format!("restic:{}", repo.display());
    // restic's own selectors choose the versions: this tree's ten.
    let selected = format!("{from} --path {}", t.path("src").display());
    let r = cmd!(
        "repair",
        "--no-state",
        "-n",
        "--from",
        &selected,
        t.path("src")
    )
    .env("RESTIC_PASSWORD", "pw")
    .run()
    .expect_code(1);
    assert!(
        said(&r, "photo.jpg").contains("would be repaired from"),
        "{}",
        r.stdout
    );
    assert!(
        said(&r, "hopeless.jpg").contains("of its path in 10 versions"),
        "{}",
        r.stdout
    );
    let r = cmd!(
        "repair",
        "--no-state",
        "-n",
        "--from",
        format!("{from} -H elsewhere"),
        t.path("src")
    )
    .env("RESTIC_PASSWORD", "pw")
    .run()
    .expect_code(1);
    assert!(
        said(&r, "photo.jpg").contains("no copy of its path in its 10 versions"),
        "{}",
        r.stdout
    );
    let r = cmd!(
        "repair",
        "--no-state",
        "--discard-damaged",
        "--from",
        &from,
        t.path("src")
    )
    .env("RESTIC_PASSWORD", "pw")
    .run()
    .expect_code(1);
    assert_eq!(fs::read(&photo).unwrap(), good, "{}", r.stdout);
    assert!(
        said(&r, "photo.jpg").contains("passed over"),
        "{}",
        r.stdout
    );
    let hopeless_said = said(&r, "hopeless.jpg");
    // Its last seven snapshots hold what the third did (restic did not read it again): one
    // copy, tried once.
    assert!(
        hopeless_said.contains("every distinct copy tried (3 of its path in 20 versions"),
        "{hopeless_said}"
    );
}

/// A tree that is not where it was backed up from (a disk mounted elsewhere now, a backup
/// taken from a snapshot's mount) is repaired all the same, from restic and from borg: the
/// backed-up folder is found by the names and sizes the damaged files share with a listing,
/// and said. Files of one size tell nothing apart by size: their names do.
#[test]
fn a_tree_mounted_elsewhere_is_repaired_from_where_it_was_backed_up() {
    let t = Tree::new();
    let mut files = Vec::new();
    for i in 0..10u64 {
        // Six files of one size, in two folders.
        let len = if i < 6 {
            30_000
        } else {
            30_000 + 1_000 * i as usize
        };
        let rel = format!("src/{}/f{i}.jpg", if i % 2 == 0 { "a" } else { "b" });
        files.push((rel.clone(), data(len, 200 + i)));
        t.write(&rel, data(len, 200 + i));
    }
    intact!("tag", "-q", t.path("src")).expect_code(0);
    let mut repos = [repository(&t, "restic"), repository(&t, "borg")];
    for repo in &mut repos {
        (repo.backup)(&t.path("src"));
    }
    // The same tree, now at another place.
    fs::create_dir_all(t.path("mnt/disk")).unwrap();
    let copy = t.path("mnt/disk/photos");
    assert!(
        Command::new("cp")
            .arg("-a")
            .arg(t.path("src"))
            .arg(&copy)
            .status()
            .unwrap()
            .success()
    );
    for repo in &repos {
        for (rel, _) in &files {
            flip_byte(&copy.join(rel.strip_prefix("src/").unwrap()), 99);
        }
        let from = &repo.from;
        let r = repo
            .intact(&[
                "repair".as_ref(),
                "--no-state".as_ref(),
                "--discard-damaged".as_ref(),
                "--from".as_ref(),
                from.as_ref(),
                copy.as_os_str(),
            ])
            .run()
            .expect_code(0);
        for (rel, good) in &files {
            let p = copy.join(rel.strip_prefix("src/").unwrap());
            assert_eq!(
                &fs::read(&p).unwrap(),
                good,
                "{from}: {}\n{}",
                p.display(),
                r.stdout
            );
        }
        assert!(
            r.stdout
                .contains(&format!("this tree's {} backed up as", copy.display())),
            "{from}: {}",
            r.stdout
        );
    }
}

/// Where the state database has a verdict for every file and knows of damage, repair reads
/// only the damage it knows: damage no run has found yet is left to `--full`, which reads
/// every file (as does a repair where no damage is known). A gone file that no source holds
/// is named with why, and the repair ends in trouble (exit 3).
#[test]
fn repair_reads_only_the_damage_the_state_database_knows() {
    let t = Tree::new();
    let db = t.path("state.db");
    let known = t.write("src/known.jpg", data(50_000, 300));
    let unknown = t.write("src/unknown.jpg", data(50_000, 301));
    for i in 0..20 {
        t.write(format!("src/more/f{i}"), data(5_000, 310 + i));
    }
    intact!("tag", "-q", "--state", &db, t.path("src")).expect_code(0);
    let (repo, restic) = restic_repo(&t, "pw");
    run(restic().args(["backup", "-q"]).arg(t.path("src")));
    // Files made after the backup, recorded: no source holds them. One is deleted, one
    // rots (and stays known damage: nothing can repair it).
    let late = t.write("src/late.jpg", data(7_000, 330));
    let hopeless = t.write("src/hopeless.jpg", data(7_000, 331));
    intact!("tag", "-q", "--state", &db, &late, &hopeless).expect_code(0);
    flip_byte(&known, 1234);
    flip_byte(&hopeless, 99);
    intact!("check", "-q", "--state", &db, t.path("src")).expect_code(1);
    flip_byte(&unknown, 4321);
    fs::remove_file(&late).unwrap();
    let from = format!("restic:{}", repo.display());
    let repair = |extra: &[&str]| {
        cmd!(
            "repair",
            "--discard-damaged",
            "--state",
            &db,
            "--from",
            &from,
            t.path("src")
        )
        .args(extra)
        .env("RESTIC_PASSWORD", "pw")
        .run()
    };
    let r = repair(&[]).expect_code(1);
    assert!(
        r.stderr.contains("only the 2 damaged file(s)"),
        "{}",
        r.stderr
    );
    assert_eq!(fs::read(&known).unwrap(), data(50_000, 300));
    assert_ne!(
        fs::read(&unknown).unwrap(),
        data(50_000, 301),
        "read without --full"
    );
    // --missing: what no source holds is named, with why (damage left outranks it: exit 1).
    let r = repair(&["--missing"]).expect_code(1);
    assert!(
        said(&r, "late.jpg").contains("no good copy found"),
        "{}",
        r.stdout
    );
    assert_ne!(fs::read(&unknown).unwrap(), data(50_000, 301));
    let r = repair(&["--full"]).expect_code(1);
    assert!(!r.stderr.contains("only the"), "{}", r.stderr);
    assert_eq!(fs::read(&unknown).unwrap(), data(50_000, 301));
    assert!(
        said(&r, "unknown.jpg").contains("restored from"),
        "{}",
        r.stdout
    );
    assert!(
        said(&r, "hopeless.jpg").contains("no good copy found"),
        "{}",
        r.stdout
    );
}

/// A tree backed up by restic, then `photo.jpg` cut short under its mtime, found damaged by
/// a check, and the damaged file backed up too: the photo, its good bytes, the state
/// database, `--from` the repository.
fn cut_short_and_backed_up(t: &Tree) -> (PathBuf, Vec<u8>, PathBuf, String) {
    let files = tree(t);
    let (photo, good) = files[0].clone();
    let db = t.path("state.db");
    let (repo, restic) = restic_repo(t, "pw");
    run(restic().args(["backup", "-q"]).arg(t.path("src")));
    behind_the_back(&photo, |p| {
        fs::OpenOptions::new()
            .write(true)
            .open(p)
            .unwrap()
            .set_len(1000)
            .unwrap()
    });
    cmd!("check", "-q", "--state", &db, t.path("src"))
        .days_later(1)
        .run()
        .expect_code(1);
    run(restic().args(["backup", "-q"]).arg(t.path("src")));
    (photo, good, db, format!("restic:{}", repo.display()))
}

/// `intact repair ARGS --state db --from from src`, two days later, told restic's password.
fn repair_from(t: &Tree, db: &Path, from: &str, args: &[&str]) -> Run {
    cmd!("repair", "-q", "--state", db, "--from", from)
        .args(args)
        .arg(t.path("src"))
        .env("RESTIC_PASSWORD", "pw")
        .days_later(2)
        .run()
}

/// A file cut short under its mtime, backed up so, repaired, then deleted: `repair --missing`
/// brings back its good bytes. The repair recorded its good size, not the damaged one's (with
/// the damaged size recorded, only the backup's damaged copy was sought, and none was good).
#[test]
fn a_file_repaired_then_deleted_comes_back_whole() {
    let t = Tree::new();
    let (photo, good, db, from) = cut_short_and_backed_up(&t);
    repair_from(&t, &db, &from, &[]).expect_code(0);
    assert_eq!(fs::read(&photo).unwrap(), good);
    deleted_comes_back(&t, &photo, &good, &db, &from);
}

/// A file found damaged, then deleted before it was repaired: `repair --missing` brings back
/// its good bytes. The damage was recorded with the size its tag names, not the damaged
/// file's (only copies of the damaged size were sought, and none was good).
#[test]
fn a_damaged_file_deleted_comes_back_whole() {
    let t = Tree::new();
    let (photo, good, db, from) = cut_short_and_backed_up(&t);
    deleted_comes_back(&t, &photo, &good, &db, &from);
}

/// `photo` deleted, a scrub finds it gone, and `repair --missing` brings back `good`.
fn deleted_comes_back(t: &Tree, photo: &Path, good: &[u8], db: &Path, from: &str) {
    fs::remove_file(photo).unwrap();
    cmd!("scrub", "-q", "--state", db, t.path("src"))
        .days_later(2)
        .run()
        .expect_code(0);
    repair_from(t, db, from, &["--missing"]).expect_code(0);
    assert_eq!(fs::read(photo).unwrap(), good);
}

/// `--from configured` is what a message prints where a configured source holds a secret:
/// it runs as printed, with the sources the owner configured (INTACT_REPAIR_FROM, else its
/// line in /etc/default/intact), and says so when there are none.
#[test]
fn repair_from_configured_uses_the_sources_the_owner_configured() {
    let t = Tree::new();
    let root = t.path("tree");
    let photo = t.write("tree/photo.jpg", data(20_000, 5));
    intact!("tag", "-q", "--no-state", &root).expect_code(0);
    let backup = t.path("backup");
    copy_tree(&root, &backup);
    fs::create_dir(t.path("empty")).unwrap();
    flip_byte(&photo, 100);
    let r = cmd!("repair", "--no-state", "--from", "configured", &root)
        .env(
            "INTACT_REPAIR_FROM",
            format!("{} {}", t.path("empty").display(), backup.display()),
        )
        .run();
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert_eq!(fs::read(&photo).unwrap(), data(20_000, 5));
    if !Path::new("/etc/default/intact").exists() {
        let r = intact!("repair", "--no-state", "--from", "configured", &root).expect_code(2);
        assert!(r.stderr.contains("no source is configured"), "{}", r.stderr);
    }
}

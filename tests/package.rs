//! The Debian package: built by scripts/deb.sh (from the debug build), its contents and fields
//! checked, and, as root (as CI runs), installed with dpkg, run, found by man, and removed
//! again. It runs under `CI=true` or with `INTACT_TEST_PACKAGE=1`, never by surprise.
//!
//! A test binary of its own: cargo runs test binaries one after another, so the release build
//! it makes does not compete with the timed fault tests.

#[macro_use]
#[path = "../src/testutil/skip.rs"]
mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Removes the package on drop, even when the test failed half way.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--remove", "intact"]).output();
    }
}

#[test]
fn the_deb_installs_runs_and_removes() {
    // It installs cargo-deb and, as root, the package itself: not on a developer's machine
    // unless asked for.
    let ci = std::env::var_os("CI").is_some();
    if !ci && std::env::var_os("INTACT_TEST_PACKAGE").is_none() {
        eprintln!("SKIPPED: package test: runs under CI=true or with INTACT_TEST_PACKAGE=1");
        return;
    }
    for tool in ["dpkg", "dpkg-deb"] {
        if Command::new(tool).arg("--version").output().is_err() {
            skip!(format!("package test: no {tool}"));
        }
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The debug build the suite already made: the packaging is the release's, without a
    // second, release build of everything.
    run(Command::new(root.join("scripts/deb.sh"))
        .current_dir(root)
        .env("INTACT_DEB_PROFILE", "dev"));
    let version = env!("CARGO_PKG_VERSION");
    let debs: Vec<PathBuf> = std::fs::read_dir(root.join("target/debian"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&format!("intact_{version}-"))
        })
        .collect();
    let [deb] = debs.as_slice() else {
        panic!("one package for {version}: {debs:?}");
    };
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(deb));
    for path in [
        "./usr/bin/intact",
        "./usr/share/man/man1/intact.1.gz",
        "./usr/share/man/man1/intact-scrub.1.gz",
        "./usr/share/man/man1/intact-archive-create.1.gz",
        "./usr/share/bash-completion/completions/intact",
        "./usr/share/zsh/vendor-completions/_intact",
        "./usr/share/fish/vendor_completions.d/intact.fish",
        "./usr/lib/systemd/system/intact-scrub@.service",
        "./usr/lib/systemd/system/intact-scrub@.timer",
        "./usr/lib/systemd/system/intact-failure@.service",
        "./usr/lib/systemd/system/intact-watch@.service",
        "./usr/share/man/man1/intact-watch.1.gz",
        "./usr/share/doc/intact/README.md",
        "./usr/share/doc/intact/docs/scrubs.md",
        "./usr/share/doc/intact/copyright",
    ] {
        assert!(contents.contains(path), "{path} missing from:\n{contents}");
    }
    let depends = run(Command::new("dpkg-deb")
        .args(["--field"])
        .arg(deb)
        .arg("Depends"));
    assert!(depends.contains("libc6"), "Depends: {depends}");
    // The man page is the CLI's: it documents the newest verbs.
    let man = run(Command::new("sh").arg("-c").arg(format!(
        "dpkg-deb --fsys-tarfile '{}' | tar -xOf - ./usr/share/man/man1/intact.1.gz | gzip -d",
        deb.display()
    )));
    assert!(man.contains("scrub") && man.contains("status"), "{man}");
    // The page of every verb intact(1) names is in the package.
    for line in man.lines().filter(|l| l.starts_with("intact\\-")) {
        let verb = line
            .trim_start_matches("intact\\-")
            .split('(')
            .next()
            .unwrap();
        let page = format!("./usr/share/man/man1/intact-{verb}.1.gz");
        assert!(contents.contains(&page), "{page} missing from:\n{contents}");
    }
    assert!(!contents.contains("intact-help.1"), "{contents}");
    if !rustix::process::geteuid().is_root() {
        skip!("package test: installing it needs root");
    }
    if Path::new("/usr/bin/intact").exists() {
        skip!("package test: /usr/bin/intact exists; not replacing it");
    }
    let _installed = Installed;
    run(Command::new("dpkg").arg("--install").arg(deb));
    assert!(Path::new("/usr/share/man/man1/intact.1.gz").exists());
    assert!(Path::new("/usr/lib/systemd/system/intact-scrub@.timer").exists());
    let said = run(Command::new("/usr/bin/intact").arg("--version"));
    assert_eq!(said.trim(), format!("intact {version}"));
    if Command::new("man").arg("--version").output().is_ok() {
        for (name, file) in [("intact", "intact"), ("intact-scrub", "intact-scrub")] {
            let page = run(Command::new("man").args(["-w", name]));
            assert_eq!(page.trim(), format!("/usr/share/man/man1/{file}.1.gz"));
        }
        // Formatted, the exit codes are a list, not lines broken mid-sentence.
        let text = run(Command::new("man")
            .args(["-P", "cat", "intact-check"])
            .env("MANWIDTH", "80"));
        assert!(text.contains("EXIT STATUS"), "{text}");
        assert!(
            text.contains("--max-percent") || text.contains("--mtime-window"),
            "{text}"
        );
    } else {
        assert!(!ci, "man is missing");
    }
    run(Command::new("dpkg").args(["--remove", "intact"]));
    assert!(!Path::new("/usr/bin/intact").exists());
    assert!(!Path::new("/usr/share/man/man1/intact.1.gz").exists());
}

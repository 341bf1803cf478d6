//! Both directions against par2cmdline (Debian's `par2`): sets made here are verified and
//! repaired by it, and sets it makes repair files here.

use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use intact_par2::{Files, Input, Plan, Set, Through, create, volume_name};

fn data(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0; len];
    fastrand::Rng::with_seed(seed).fill(&mut v);
    v
}

fn par2(dir: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("par2")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("par2 (par2cmdline) is installed");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// Files by name in a directory.
struct Dir<'a>(&'a Path, &'a [&'a str]);

impl Files for Dir<'_> {
    fn open(&self, i: usize) -> std::io::Result<Box<dyn Through + '_>> {
        Ok(Box::new(fs::File::open(self.0.join(self.1[i]))?))
    }

    fn read_at(&self, i: usize, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::os::unix::fs::FileExt;
        fs::File::open(self.0.join(self.1[i]))?.read_at(buf, offset)
    }
}

fn make_set(dir: &Path, names: &[&str], slice: u64, rec: u32) {
    let inputs: Vec<Input> = names
        .iter()
        .map(|n| Input {
            name: n.as_bytes().to_vec(),
            len: fs::metadata(dir.join(n)).unwrap().len(),
        })
        .collect();
    let mut volume = fs::File::create(dir.join(volume_name("set", 0, rec))).unwrap();
    // Little memory: the recovery data is computed in several passes, later ones reading
    // ranges of each slice.
    let plan = Plan {
        slice_size: slice,
        recovery_count: rec,
        threads: 2,
        memory: 64 << 10,
    };
    let created = create(&inputs, &Dir(dir, names), &plan, &mut volume).unwrap();
    fs::write(dir.join("set.par2"), &created.index).unwrap();
}

fn flip(path: &Path, at: usize) {
    let mut b = fs::read(path).unwrap();
    b[at] ^= 0x40;
    fs::write(path, b).unwrap();
}

#[test]
fn par2cmdline_verifies_and_repairs_our_sets() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let a = data(1_000_000, 1);
    let b = data(123_457, 2);
    fs::write(d.join("a.bin"), &a).unwrap();
    fs::write(d.join("b.bin"), &b).unwrap();
    fs::write(d.join("empty"), b"").unwrap();
    // Slices that do not end on a whole block of the multiplication (16,388 bytes, in
    // strips of 3,328: the last one 3,076).
    make_set(d, &["a.bin", "b.bin", "empty"], 16388, 12);
    let (ok, out) = par2(d, &["verify", "set.par2"]);
    assert!(ok, "{out}");

    // A flipped bit, a zeroed 64 KiB run, a truncated file.
    flip(&d.join("a.bin"), 77);
    let mut z = fs::read(d.join("a.bin")).unwrap();
    z[300_000..300_000 + 65536].fill(0);
    fs::write(d.join("a.bin"), z).unwrap();
    fs::write(d.join("b.bin"), &b[..50_000]).unwrap();
    let (ok, out) = par2(d, &["verify", "set.par2"]);
    assert!(!ok, "{out}");
    let (ok, out) = par2(d, &["repair", "set.par2"]);
    assert!(ok, "{out}");
    assert_eq!(fs::read(d.join("a.bin")).unwrap(), a);
    assert_eq!(fs::read(d.join("b.bin")).unwrap(), b);
}

#[test]
fn slices_too_large_to_hold_are_checksummed_as_they_stream_by() {
    // Slices larger than a first batch are not held whole (a file of more than 32 GiB in
    // 2,000 slices): their MD5s and each strip's CRC32 are taken as the file is read through.
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let slice = intact_par2::FIRST_BATCH as u64 + 128;
    let a = data(2 * slice as usize + 12_345, 5);
    let b = data(3_000_001, 6);
    fs::write(d.join("a.bin"), &a).unwrap();
    fs::write(d.join("b.bin"), &b).unwrap();
    make_set(d, &["a.bin", "b.bin"], slice, 2);
    let (ok, out) = par2(d, &["verify", "set.par2"]);
    assert!(ok, "{out}");
    // Damage in a's first and last slices: two damaged slices, two recovery slices.
    flip(&d.join("a.bin"), 1_000);
    flip(&d.join("a.bin"), 2 * slice as usize + 12_000);
    let (ok, out) = par2(d, &["repair", "set.par2"]);
    assert!(ok, "{out}");
    assert_eq!(fs::read(d.join("a.bin")).unwrap(), a);
    assert_eq!(fs::read(d.join("b.bin")).unwrap(), b);
}

#[test]
fn sets_from_par2cmdline_repair_here() {
    let t = tempfile::tempdir().unwrap();
    let d = t.path();
    let a = data(700_001, 3);
    let b = data(40_000, 4);
    fs::write(d.join("a.bin"), &a).unwrap();
    fs::write(d.join("b.bin"), &b).unwrap();
    let (ok, out) = par2(
        d,
        &[
            "create", "-q", "-s8192", "-r10", "set.par2", "a.bin", "b.bin",
        ],
    );
    assert!(ok, "{out}");
    let mut files = Vec::new();
    for e in fs::read_dir(d).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "par2") {
            files.push(fs::read(p).unwrap());
        }
    }
    let set = Set::load(&files.iter().map(|f| &f[..]).collect::<Vec<_>>()).unwrap();
    assert_eq!(set.files.len(), 2);

    let mut damaged_a = a.clone();
    damaged_a[10] ^= 1;
    damaged_a[500_000..500_000 + 20_000].fill(0);
    let contents = |name: &[u8]| -> Option<Vec<u8>> {
        match name {
            b"a.bin" => Some(damaged_a.clone()),
            // b.bin deleted: rebuilt whole.
            _ => None,
        }
    };
    let rec = set
        .recover(
            &mut |i| {
                Ok(contents(&set.files[i].name)
                    .map(|c| Box::new(std::io::Cursor::new(c)) as Box<dyn Read>))
            },
            2,
        )
        .unwrap();
    for (i, f) in set.files.iter().enumerate() {
        let cur = contents(&f.name);
        let mut reader = cur.as_deref();
        let mut out = Vec::new();
        set.restore(
            i,
            &rec,
            reader.as_mut().map(|r| r as &mut dyn Read),
            &mut |bytes| {
                out.extend_from_slice(bytes);
                Ok(())
            },
        )
        .unwrap();
        let want = if f.name == b"a.bin" { &a } else { &b };
        assert_eq!(&out, want, "{}", String::from_utf8_lossy(&f.name));
    }
}

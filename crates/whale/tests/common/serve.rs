//! `whale serve` as a child process on loopback, and a proxy in front of it that can play a
//! server that died.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// `whale serve` serving `model` as `name`, stopped when dropped.
pub struct Serve {
    child: Child,
    /// The API root, `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
}

impl Serve {
    /// Without a key (`WHALE_API_KEY` is not passed on) and with the flags in `extra`.
    pub fn start(model: &Path, name: &str, extra: &[&str]) -> Self {
        Self::start_on(model, name, 0, extra)
    }

    /// [`Serve::start`] listening on `port` (0: any free one).
    fn start_on(model: &Path, name: &str, port: u16, extra: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
        command.env_remove("WHALE_API_KEY");
        Self::spawn(&mut command, model, name, port, extra)
    }

    /// Keyed through the variable `WHALE_API_KEY`, and with the flags in `extra`.
    pub fn start_keyed(model: &Path, name: &str, key: &str, extra: &[&str]) -> Self {
        let mut command = Command::new(env!("CARGO_BIN_EXE_whale"));
        command.env("WHALE_API_KEY", key);
        Self::spawn(&mut command, model, name, 0, extra)
    }

    /// As whale's runs under `root/runs` need it: loading adapters from there at run time.
    pub fn for_runs_in(root: &Path, model: &Path, name: &str) -> Self {
        Self::for_runs_in_on(root, model, name, 0)
    }

    /// [`Serve::for_runs_in`] listening on `port` (0: any free one), to stand in for a server
    /// that stopped.
    pub fn for_runs_in_on(root: &Path, model: &Path, name: &str, port: u16) -> Self {
        let runs = root.join("runs");
        std::fs::create_dir_all(&runs).expect("the runs directory");
        let runs = runs.to_str().expect("a UTF-8 path");
        Self::start_on(model, name, port, &["--allow-runtime-loading", "--allowed-path", runs])
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        let authority = self.base_url.trim_start_matches("http://").split('/').next().unwrap_or_default();
        authority.rsplit(':').next().and_then(|p| p.parse().ok()).expect("a port in the base URL")
    }

    fn spawn(command: &mut Command, model: &Path, name: &str, port: u16, extra: &[&str]) -> Self {
        let mut child = command
            .args(["serve", "--host", "127.0.0.1", "--port", &port.to_string(), "--served-model-name", name, "--model"])
            .arg(model)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("whale serve starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line).expect("its first line");
        let base_url = line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line {line:?}"));
        Self { child, base_url: base_url.to_string() }
    }
}

impl Serve {
    /// Sends the server SIGTERM and waits (at most a minute) for it to exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM).expect("SIGTERM sent");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().expect("the server's status") {
                return status;
            }
            assert!(std::time::Instant::now() < deadline, "whale serve still runs a minute after SIGTERM");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        // The test is over either way; a server that already exited needs nothing more.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback HTTP proxy that forwards one request per connection to `upstream` while its
/// budget of chat requests lasts; past it every connection is dropped unanswered, as a server
/// that died does. Admin requests (adapter loading) always pass.
pub struct Outage {
    /// The API root of the proxy, `http://127.0.0.1:PORT/v1`.
    pub base_url: String,
    budget: Arc<AtomicU64>,
}

impl Outage {
    pub fn start(upstream_base_url: &str) -> Self {
        let upstream =
            upstream_base_url.trim_start_matches("http://").split('/').next().expect("host:port").to_string();
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let base_url = format!("http://{}/v1", listener.local_addr().expect("address"));
        let budget = Arc::new(AtomicU64::new(u64::MAX));
        let shared = budget.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let (upstream, budget) = (upstream.clone(), shared.clone());
                std::thread::spawn(move || forward(client, &upstream, &budget));
            }
        });
        Self { base_url, budget }
    }

    /// From now on, forward `chat_requests` more chat requests, then play dead.
    pub fn die_after(&self, chat_requests: u64) {
        self.budget.store(chat_requests, Ordering::SeqCst);
    }

    /// The server is back.
    pub fn recover(&self) {
        self.budget.store(u64::MAX, Ordering::SeqCst);
    }
}

/// Reads one request from `client`; forwards it (asking the upstream to close after replying)
/// and copies the reply back, or drops the connection once the budget is spent.
fn forward(mut client: TcpStream, upstream: &str, budget: &AtomicU64) {
    let Some((head, body)) = read_request(&mut client) else { return };
    let chat = head.lines().next().is_some_and(|line| line.contains("/chat/completions"));
    if chat && budget.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| left.checked_sub(1)).is_err() {
        return;
    }
    let head: String = head
        .lines()
        .filter(|line| !line.to_ascii_lowercase().starts_with("connection:"))
        .map(|line| format!("{line}\r\n"))
        .collect();
    let Ok(mut server) = TcpStream::connect(upstream) else { return };
    let request = [head.as_bytes(), b"connection: close\r\n\r\n", &body].concat();
    let mut reply = Vec::new();
    if server.write_all(&request).is_ok() && server.read_to_end(&mut reply).is_ok() {
        let _ = client.write_all(&reply);
    }
}

/// The head (without its blank line) and the body of one HTTP request.
fn read_request(client: &mut TcpStream) -> Option<(String, Vec<u8>)> {
    let mut reader = BufReader::new(client.try_clone().ok()?);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        if line == "\r\n" {
            break;
        }
        head.push_str(&line);
    }
    let length = head
        .lines()
        .find_map(|line| line.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_string()))
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some((head.trim_end().to_string(), body))
}

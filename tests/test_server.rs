//! The throwaway PostgreSQL of a test run (`pglock_testing::database_url`): one server for every
//! process under one `cargo`, which outlives the process that started it and is removed when
//! the run ends, however it ends.
//!
//! The test plays a whole run: this binary, run again through a link named `cargo`, is the
//! run's runner; it starts two more copies of this binary, one after the other, and each asks
//! for the database URL. Then the run is ended by a signal to its process group, as a CI
//! timeout would end it.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A child's role, passed on its command line (libtest takes it for a filter that matches no
/// test): an argument, unlike an environment variable, cannot leak into the test run itself
/// and turn the real test into a child that exits with success.
const ROLE: &str = "pglock-test-server-role=";
const TEST: &str = "one_server_per_run_shared_by_its_processes_and_removed_when_it_ends";

/// This binary again, running only this test, in `role`.
fn this_test(program: &Path, role: &str) -> Command {
    let mut command = Command::new(program);
    command
        .args([TEST, "--exact", "--nocapture", "--test-threads=1"])
        .arg(format!("{ROLE}{role}"))
        .env_remove("DATABASE_URL");
    command
}

/// The last line of `command`'s output that starts with `prefix`, without the prefix.
fn reported(output: &[u8], prefix: &str) -> Option<String> {
    String::from_utf8_lossy(output)
        .lines()
        .filter_map(|line| {
            line.split_once(prefix)
                .map(|(_, rest)| rest.trim().to_owned())
        })
        .next_back()
}

/// A test process of the run: asks for the database URL and reports it.
fn act_as_test_process() -> ! {
    println!("URL {}", pglock_testing::database_url());
    std::process::exit(0);
}

/// The run's `cargo`: two test processes in turn, then wait until the run is ended.
fn act_as_runner() -> ! {
    let exe = std::env::current_exe().expect("this test binary");
    let mut urls = Vec::new();
    for _ in 0..2 {
        let output = this_test(&exe, "test-process")
            .output()
            .expect("a test process");
        urls.push(reported(&output.stdout, "URL ").expect("the test process reports its URL"));
    }
    println!("URLS {} {}", urls[0], urls[1]);
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    std::process::exit(0);
}

fn answers(url: &str) -> bool {
    let port: u16 = url
        .rsplit_once(':')
        .and_then(|(_, rest)| rest.split('/').next())
        .and_then(|port| port.parse().ok())
        .expect("a port in the URL");
    TcpStream::connect_timeout(
        &SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(1),
    )
    .is_ok()
}

/// The run directories of the process `pid`.
fn run_dirs(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("pglock-run-{pid}-");
    std::fs::read_dir(std::env::temp_dir())
        .expect("the temporary directory")
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&prefix))
        .map(|entry| entry.path())
        .collect()
}

/// Polls for a state the watchdog reaches on its own time (it polls the run every 200 ms).
fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn one_server_per_run_shared_by_its_processes_and_removed_when_it_ends() {
    let role = std::env::args().find_map(|arg| arg.strip_prefix(ROLE).map(str::to_owned));
    match role.as_deref() {
        Some("runner") => act_as_runner(),
        Some("test-process") => act_as_test_process(),
        Some(other) => panic!("unknown role {other:?}"),
        None => {}
    }
    // A link named `cargo` makes this binary look like a run's runner.
    let links =
        Links(std::env::temp_dir().join(format!("pglock-fake-cargo-{}", std::process::id())));
    std::fs::create_dir_all(&links.0).unwrap();
    let cargo = links.0.join("cargo");
    let _ = std::fs::remove_file(&cargo);
    std::os::unix::fs::symlink(std::env::current_exe().unwrap(), &cargo).unwrap();
    let mut runner = {
        use std::os::unix::process::CommandExt;
        this_test(&cargo, "runner")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("the runner")
    };
    let mut stdout = BufReader::new(runner.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("URLS ") {
        line.clear();
        if stdout.read_line(&mut line).unwrap() == 0 {
            panic!("the runner ended early: {:?}", runner.wait());
        }
    }
    let urls: Vec<&str> = line.trim().rsplit(' ').take(2).collect();

    assert_eq!(urls[0], urls[1], "both processes of the run got one server");
    assert!(
        answers(urls[0]),
        "the server outlives the test process that started it"
    );
    assert_eq!(run_dirs(runner.id()).len(), 1, "one run directory");

    // End the run as a CI timeout would: a signal to its whole process group.
    let status = Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", runner.id())])
        .status()
        .unwrap();
    assert!(status.success());
    runner.wait().unwrap();
    eventually("the run's server is stopped", || !answers(urls[0]));
    eventually("the run's directory is removed", || {
        run_dirs(runner.id()).is_empty()
    });
}

/// The directory of the `cargo` link, removed however the test ends.
struct Links(PathBuf);

impl Drop for Links {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

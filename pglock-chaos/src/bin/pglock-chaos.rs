//! The chaos suite's command: a run (the parent: servers, nemesis, history, reports), or,
//! with `--worker`, one of its worker processes.
//!
//! ```text
//! pglock-chaos [--seed N] [--seconds S] [--out DIR] [--unsafe | --broken-lock]
//! pglock-chaos --check DIR      # check DIR/history.jsonl again, rewrite its reports
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs, unreachable_pub)]

use std::path::PathBuf;
use std::time::Duration;

use pglock_chaos::run::{Config, check_and_write, run};
use pglock_chaos::spec::{Mode, WorkerSpec};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let code = if let [flag, dir] = args.as_slice()
        && flag == "--check"
    {
        match pglock_chaos::run::recheck(std::path::Path::new(dir)) {
            Ok(report) => {
                println!("{report}");
                i32::from(!(report.is_valid() && report.liveness_ok()))
            }
            Err(err) => {
                eprintln!("pglock-chaos --check: {err}");
                2
            }
        }
    } else if args.iter().any(|a| a == "--worker") {
        match WorkerSpec::from_args(&args) {
            Ok(spec) => runtime.block_on(pglock_chaos::worker::main(spec)),
            Err(err) => {
                eprintln!("pglock-chaos --worker: {err}");
                2
            }
        }
    } else {
        match parse(&args) {
            Ok(config) => runtime.block_on(parent(config)),
            Err(err) => {
                eprintln!(
                    "pglock-chaos: {err}\nusage: pglock-chaos [--seed N] [--seconds S] [--out DIR] [--unsafe | --broken-lock]"
                );
                2
            }
        }
    };
    std::process::exit(code);
}

fn parse(args: &[String]) -> Result<Config, String> {
    let (mut seed, mut seconds, mut out, mut mode) =
        (7, 60, PathBuf::from("target/chaos"), Mode::Safe);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--seed" => seed = value()?.parse().map_err(|_| "bad --seed")?,
            "--seconds" => seconds = value()?.parse().map_err(|_| "bad --seconds")?,
            "--out" => out = PathBuf::from(value()?),
            "--unsafe" => mode = Mode::Unsafe,
            "--broken-lock" => mode = Mode::BrokenLock,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut config = Config::new(seed, Duration::from_secs(seconds), out, exe);
    config.mode = mode;
    Ok(config)
}

async fn parent(config: Config) -> i32 {
    eprintln!(
        "pglock-chaos: seed {}, {:?}, out {}",
        config.seed,
        config.duration,
        config.out_dir.display()
    );
    let outcome = match run(&config).await {
        Ok(outcome) => outcome,
        Err(err) => {
            eprintln!("pglock-chaos: the run could not be set up: {err}");
            return 1;
        }
    };
    let report = match check_and_write(&config, &outcome) {
        Ok(report) => report,
        Err(err) => {
            eprintln!("pglock-chaos: the reports could not be written: {err}");
            return 1;
        }
    };
    println!("{report}");
    println!("history: {}", outcome.history_path.display());
    println!(
        "reports: {}/report.{{txt,md}}, timeline.svg",
        config.out_dir.display()
    );
    for problem in &outcome.problems {
        println!("problem with the run itself: {problem}");
    }
    let good = report.is_valid() && report.liveness_ok() && outcome.problems.is_empty();
    println!(
        "seed {}: {}",
        config.seed,
        if good {
            "valid"
        } else {
            "NOT VALID (see the report)"
        }
    );
    i32::from(!good)
}

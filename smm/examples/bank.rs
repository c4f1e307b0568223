//! A bank on shared memory: the application of `docs/smm.md`, "Write your own application".
//!
//! Accounts are 64-bit variables, four to a page (account `i` is page `i / 4`, slot `i % 4`);
//! the map file names which hosts hold each page. Every host attaches and enters barrier 0, so
//! every page has a live copy; host 0 then puts 1 000 in every account, and after barrier 0
//! again each host moves random amounts between random accounts: one isochron reads and
//! schedules both accounts, the next assigns both. Every 25 transfers, and at the end, one
//! isochron reads every account; the total must never change. It prints one JSON line.
//!
//! ```sh
//! cargo run -p isotach-smm --features daemon --example bank -- \
//!     --config cluster.toml --host alpha --transfers 200
//! ```
//!
//! With `--embedded-siu` the host's SIU runs inside the bank process (start no `isotach siu`
//! for that host).

use isotach_rng::Rng;
use isotach_smm::{Addr, ConnectOptions, Smm, SmmError, WaitError, Width};
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Money in every account at the start.
const OPENING_BALANCE: u64 = 1_000;
/// Accounts per page.
const SLOTS: u32 = 4;
/// Transfers between snapshots.
const SNAPSHOT_EVERY: u64 = 25;

struct Args {
    config: String,
    host: String,
    accounts: u32,
    transfers: u64,
    seed: u64,
    timeout: Duration,
    embedded_siu: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        config: String::new(),
        host: String::new(),
        accounts: 16,
        transfers: 100,
        seed: 1,
        timeout: Duration::from_secs(30),
        embedded_siu: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--config" => a.config = value()?,
            "--host" => a.host = value()?,
            "--accounts" => {
                a.accounts = u32::try_from(number(value()?)?).map_err(|e| e.to_string())?
            }
            "--transfers" => a.transfers = number(value()?)?,
            "--seed" => a.seed = number(value()?)?,
            "--timeout-s" => a.timeout = Duration::from_secs(number(value()?)?),
            "--embedded-siu" => a.embedded_siu = true,
            "-h" | "--help" => {
                return Err("usage: bank --config FILE --host NAME [--accounts N (16)] \
                            [--transfers N (100)] [--seed S] [--timeout-s S (30)] \
                            [--embedded-siu (run the host's SIU in this process)]"
                    .into());
            }
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if a.config.is_empty() || a.host.is_empty() || a.accounts < 2 {
        return Err("--config and --host are required, --accounts at least 2".into());
    }
    Ok(a)
}

fn account(i: u32) -> Addr {
    Addr::new(i / SLOTS, i % SLOTS)
}

/// One isochron reading every account; returns their sum.
fn snapshot<L: isotach_smm::SiuLink>(smm: &mut Smm<L>, a: &Args) -> Result<u64, WaitError> {
    let mut iso = smm.node().isochron();
    let reads = (0..a.accounts)
        .map(|i| iso.read(account(i), Width::W64))
        .collect::<Result<Vec<_>, SmmError>>()?;
    iso.end()?;
    let mut total = 0u64;
    for r in reads {
        total += smm.wait(r, a.timeout)?;
    }
    Ok(total)
}

/// Moves a random amount from one random account to another, atomically.
fn transfer<L: isotach_smm::SiuLink>(
    smm: &mut Smm<L>,
    a: &Args,
    rng: &mut Rng,
) -> Result<(), WaitError> {
    let from = rng.below(u64::from(a.accounts)) as u32;
    let to = (from + 1 + rng.below(u64::from(a.accounts - 1)) as u32) % a.accounts;
    let (x, y) = (account(from), account(to));
    // Read and reserve both accounts in one isochron: nobody reads them until we assign.
    let mut iso = smm.node().isochron();
    let (rx, ry) = (iso.read(x, Width::W64)?, iso.read(y, Width::W64)?);
    iso.sched(x)?;
    iso.sched(y)?;
    iso.end()?;
    let (vx, vy) = (smm.wait(rx, a.timeout)?, smm.wait(ry, a.timeout)?);
    let amount = if vx == 0 {
        0
    } else {
        1 + rng.below(vx.min(10))
    };
    let mut iso = smm.node().isochron();
    iso.assign(x, Width::W64, vx - amount)?;
    iso.assign(y, Width::W64, vy + amount)?;
    iso.end()?;
    Ok(())
}

fn run(a: &Args) -> Result<String, String> {
    let started = Instant::now();
    let opts = ConnectOptions {
        timeout: a.timeout,
        embedded_siu: a.embedded_siu,
        ..ConnectOptions::default()
    };
    let (mut smm, joined) =
        Smm::connect_with(&a.config, &a.host, &opts).map_err(|e| e.to_string())?;
    let me = smm.node().host();
    let step = |what: &str, e: WaitError| format!("host {}: {what}: {e}", a.host);
    // Every host attached: each page has a live copy before anyone writes it.
    smm.barrier(0, 1, a.timeout)
        .map_err(|e| step("start barrier", e))?;
    if me == 0 {
        let mut iso = smm.node().isochron();
        for i in 0..a.accounts {
            iso.write(account(i), Width::W64, OPENING_BALANCE)
                .map_err(|e| e.to_string())?;
        }
        iso.end().map_err(|e| e.to_string())?;
    }
    smm.barrier(0, 1, a.timeout)
        .map_err(|e| step("opening barrier", e))?;
    let expected = OPENING_BALANCE * u64::from(a.accounts);
    let mut totals = vec![snapshot(&mut smm, a).map_err(|e| step("snapshot", e))?];
    // The transfers' random choices (not security relevant): one stream per host.
    let mut rng = Rng::stream(a.seed, u64::from(me));
    for t in 1..=a.transfers {
        transfer(&mut smm, a, &mut rng).map_err(|e| step("transfer", e))?;
        if t % SNAPSHOT_EVERY == 0 {
            totals.push(snapshot(&mut smm, a).map_err(|e| step("snapshot", e))?);
        }
    }
    // Everybody's transfers are done before the last snapshot, and everybody has taken it
    // before anyone leaves (its copies answer the others' reads).
    smm.barrier(0, 1, a.timeout)
        .map_err(|e| step("end barrier", e))?;
    totals.push(snapshot(&mut smm, a).map_err(|e| step("snapshot", e))?);
    smm.barrier(0, 1, a.timeout)
        .map_err(|e| step("leave barrier", e))?;
    let copies: Vec<String> = smm
        .node()
        .snapshot()
        .iter()
        .map(|(addr, v, _)| format!("\"{addr}\":{v}"))
        .collect();
    let ok = totals.iter().all(|&t| t == expected);
    Ok(format!(
        "{{\"host\":\"{}\",\"transfers\":{},\"snapshots\":{},\"totals\":{:?},\"expected\":{expected},\
         \"pages_recovered\":{:?},\"pages_started_empty\":{:?},\"copies\":{{{}}},\
         \"elapsed_ms\":{},\"ok\":{ok}}}",
        a.host,
        a.transfers,
        totals.len(),
        totals,
        joined.pages_recovered,
        joined.pages_started_empty,
        copies.join(","),
        started.elapsed().as_millis()
    ))
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("bank: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(json) => {
            println!("{json}");
            if json.ends_with("\"ok\":true}") {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("bank: {e}");
            ExitCode::from(1)
        }
    }
}

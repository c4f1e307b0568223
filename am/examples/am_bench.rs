//! Run the AM benchmark until `isotach bench am` exists:
//! `cargo run --release -p isotach-am --example am_bench [-- --json]`.
//! The hidden first argument `__am-bench-peer` runs the peer process.

use isotach_am::bench::{BenchOptions, bench_peer_main, run_bench};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("__am-bench-peer") {
        if let Err(e) = bench_peer_main(&args[1..]) {
            eprintln!("bench peer: {e}");
            std::process::exit(1);
        }
        return;
    }
    let json = args.iter().any(|a| a == "--json");
    match run_bench(BenchOptions::default()) {
        Ok(r) if json => println!("{}", serde_json::to_string(&r).expect("report serializes")),
        Ok(r) => println!(
            "{}",
            serde_json::to_string_pretty(&r).expect("report serializes")
        ),
        Err(e) => {
            eprintln!("am bench: {e}");
            std::process::exit(1);
        }
    }
}

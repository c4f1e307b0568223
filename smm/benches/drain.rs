//! Drain of one pulse of write srefs, by sort kind. `cargo bench -p isotach-smm`.

use isotach_smm::testkit::{SortKind, pulse};

fn main() {
    divan::main();
}

fn drain(bencher: divan::Bencher<'_, '_>, srefs: usize, kind: SortKind) {
    bencher
        .counter(divan::counter::ItemsCount::new(srefs))
        .with_inputs(|| pulse(srefs, kind))
        .bench_local_values(|(mut node, eop)| {
            node.handle_siu(&eop).expect("drain");
            node
        });
}

#[divan::bench]
fn vector_32(b: divan::Bencher<'_, '_>) {
    drain(b, 32, SortKind::Vector);
}

#[divan::bench]
fn software_32(b: divan::Bencher<'_, '_>) {
    drain(b, 32, SortKind::Software);
}

#[divan::bench(args = [1_000, 100_000])]
fn hybrid(b: divan::Bencher<'_, '_>, srefs: usize) {
    drain(b, srefs, SortKind::Hybrid);
}

#[divan::bench(args = [1_000, 100_000])]
fn software(b: divan::Bencher<'_, '_>, srefs: usize) {
    drain(b, srefs, SortKind::Software);
}

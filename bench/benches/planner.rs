//! One search-offerings tick's planning: 1,000 requests, each planned against what its queries
//! return from a market of 10,000 Capacity Block offerings (`make bench`).

use benches::{answered, market, requests, tick};
use capacity_pilot::domain::catalog::PriceTable;
use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;

fn planner(c: &mut Criterion) {
    let world = answered(&market(10_000, 1), requests(1_000, 1));
    let offered: usize = world.iter().map(|(_, o)| o.len()).sum();
    eprintln!(
        "planner: 1,000 requests, 10,000 offerings, {offered} offerings answered in all, {} requests with none",
        world.iter().filter(|(_, o)| o.is_empty()).count()
    );
    let prices = PriceTable::default();
    let mut g = c.benchmark_group("planner");
    g.sample_size(10);
    g.bench_function("one tick: 1,000 requests over 10,000 offerings", |b| {
        b.iter(|| tick(black_box(&world), &prices))
    });
    g.finish();
}

criterion_group!(benches, planner);
criterion_main!(benches);

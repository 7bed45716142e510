//! A study as people read it: the plain text `whale study` prints, `report.html` and the
//! figures under `figures/`, all from a [`Study`] (so from the result files alone).

use super::error::StudyError;
use super::result::ARMS_DIR;
use super::statistics::{Difference, SeedCoupling, TARGET_HALF_WIDTH};
use super::summary::{DomainStudy, Study};
use super::verdicts::signed;
use crate::figures::{self, ForestRow};
use std::fmt::Write as _;
use std::path::Path;
use whale_loop::run_dir::write_atomic;

/// One figure of a config: its file stem under `figures/` and its SVG.
struct Figure {
    stem: String,
    svg: String,
}

/// Every figure of one config: the curves, the forest plot, one heat map per coupling matrix.
fn figures_of(domain: &DomainStudy) -> Result<Vec<Figure>, StudyError> {
    let title = format!("{} ({}), seeds {:?}", domain.name, domain.domain, domain.seeds);
    let rows: Vec<ForestRow> = domain
        .differences
        .iter()
        .map(|d| ForestRow {
            label: format!("{} ({})", d.arm, d.metric),
            value: d.estimate.value,
            lo: d.estimate.lo,
            hi: d.estimate.hi,
        })
        .collect();
    let mut figures = vec![
        Figure { stem: format!("{}-curves", domain.name), svg: figures::curves_svg(&title, domain.k, &domain.curves)? },
        Figure { stem: format!("{}-forest", domain.name), svg: figures::forest_svg(&title, &rows)? },
    ];
    for SeedCoupling { seed, matrix: coupling } in &domain.couplings {
        let title = format!(
            "{}, seed {seed}: test mean@{} of each accepted harness under each weights",
            domain.name, coupling.k
        );
        let svg = figures::heat_map_svg(&title, coupling)?;
        figures.push(Figure { stem: format!("{}-coupling-seed-{seed}", domain.name), svg });
    }
    Ok(figures)
}

/// Writes `study.json`, `report.html` and `figures/<config>-*.png` into `root`.
pub fn write(study: &Study, root: &Path) -> Result<(), StudyError> {
    let mut page = String::new();
    let dir = root.join("figures");
    std::fs::create_dir_all(&dir).map_err(|e| StudyError::Write { path: dir.clone(), reason: e.to_string() })?;
    for domain in &study.domains {
        let figures = figures_of(domain)?;
        for figure in &figures {
            let path = dir.join(format!("{}.png", figure.stem));
            let png = figures::png(&figure.svg)?;
            write_atomic(&path, &png).map_err(|e| StudyError::Write { path, reason: e.to_string() })?;
        }
        page.push_str(&domain_html(domain, &figures));
    }
    let json = serde_json::to_string_pretty(study).unwrap_or_default();
    for (file, text) in [("study.json", json), ("report.html", html(study, &page))] {
        let path = root.join(file);
        write_atomic(&path, text.as_bytes()).map_err(|e| StudyError::Write { path, reason: e.to_string() })?;
    }
    Ok(())
}

/// The study as plain text: per config, the CPU of each seed, the paired differences, the coupling
/// matrices and the verdicts.
pub fn text(study: &Study) -> String {
    let mut out = String::new();
    for domain in &study.domains {
        let _ = writeln!(out, "{} ({}), seeds {:?}", domain.name, domain.domain, domain.seeds);
        for line in provenance_lines(domain) {
            let _ = writeln!(out, "  {line}");
        }
        let _ = writeln!(
            out,
            "  {:<22} {:<6} {:>28} {:>8} {:>7} {:>14}",
            "condition - whale", "metric", "paired [95% CI]", "seeds", "tasks", "tasks for ±0.03"
        );
        for d in &domain.differences {
            let seeds = format!("{}/{}", d.seeds_agreeing, d.seeds);
            let _ = writeln!(
                out,
                "  {:<22} {:<6} {:>28} {:>8} {:>7} {:>14}",
                d.arm.name(),
                d.metric,
                signed(&d.estimate),
                seeds,
                d.tasks,
                sized(d)
            );
        }
        let _ = writeln!(out, "  {:<22} {:>28} {:>8}", "condition", "final - start [95% CI]", "seeds");
        for m in &domain.movements {
            let seeds = format!("{}/{}", m.seeds_agreeing, m.seeds);
            let _ = writeln!(out, "  {:<22} {:>28} {:>8}", m.arm.name(), signed(&m.estimate), seeds);
        }
        for SeedCoupling { seed, matrix: coupling } in &domain.couplings {
            let _ = writeln!(out, "  coupling matrix, seed {seed}:");
            for line in coupling.text().lines() {
                let _ = writeln!(out, "    {line}");
            }
        }
        for verdict in &domain.verdicts {
            let _ = writeln!(out, "  {}: {} ({})", verdict.finding, verdict.status, verdict.detail);
        }
    }
    out
}

/// Which CPU each seed ran on, whether they span several CPU families, and which seeds have
/// no result file yet.
fn provenance_lines(domain: &DomainStudy) -> Vec<String> {
    let mut by_cpu: Vec<(String, Vec<u64>)> = Vec::new();
    for seed in &domain.provenance {
        for cpu in &seed.cpus {
            let cpu = cpu.to_string();
            match by_cpu.iter_mut().find(|(known, _)| *known == cpu) {
                Some((_, seeds)) => seeds.push(seed.seed),
                None => by_cpu.push((cpu, vec![seed.seed])),
            }
        }
    }
    let mut lines: Vec<String> = by_cpu.iter().map(|(cpu, seeds)| format!("cpu: {cpu}: seeds {seeds:?}")).collect();
    for seed in domain.provenance.iter().filter(|seed| seed.cpus.len() > 1) {
        lines.push(format!("seed {}: its arms finished on {} CPUs", seed.seed, seed.cpus.len()));
    }
    let mut families: Vec<(&str, &[String])> = domain
        .provenance
        .iter()
        .flat_map(|seed| &seed.cpus)
        .map(|cpu| (cpu.arch.as_str(), cpu.features.as_slice()))
        .collect();
    families.sort();
    families.dedup();
    if families.len() > 1 {
        lines.push(format!(
            "the seeds ran on {} CPU families (instruction sets): each seed's numbers reproduce bit for bit \
             only on its own family; the pooled verdicts are what should hold on any",
            families.len()
        ));
    }
    if !domain.missing_seeds.is_empty() {
        lines.push(format!("missing seeds {:?}: no result file yet", domain.missing_seeds));
    }
    for seed in &domain.unfinished {
        lines.push(format!("seed {}, the arms finished so far (their files in {ARMS_DIR}/):", seed.seed));
        for arm in &seed.arms {
            lines.push(format!(
                "  {:<22} {:.3} -> {} after {} training rollouts",
                arm.arm, arm.start.value, arm.end, arm.training_rollouts
            ));
        }
        if let Some(coupling) = &seed.coupling {
            lines.push(format!("seed {}, the WHALE run's coupling matrix:", seed.seed));
            lines.extend(coupling.text().lines().map(|line| format!("  {line}")));
        }
    }
    lines
}

/// The projected test tasks per seed, or where only more seeds would do, how many.
fn sized(difference: &Difference) -> String {
    match (difference.tasks_for_target, difference.seeds_for_target) {
        (Some(tasks), _) => tasks.to_string(),
        (None, Some(seeds)) => format!("{seeds} seeds"),
        (None, None) => "more seeds".to_string(),
    }
}

fn domain_html(domain: &DomainStudy, figures: &[Figure]) -> String {
    let mut body = format!("<h2>{} ({})</h2>\n<ul>\n", domain.name, domain.domain);
    for line in provenance_lines(domain) {
        let _ = writeln!(body, "<li>{line}</li>");
    }
    for verdict in &domain.verdicts {
        let _ = writeln!(body, "<li><b>{}</b>: {} — {}</li>", verdict.finding, verdict.status, verdict.detail);
    }
    body.push_str("</ul>\n");
    for figure in figures {
        let _ = writeln!(body, "<div>{}</div>", figure.svg);
    }
    body.push_str("<table><tr><th>condition − whale</th><th>metric</th>");
    let _ = writeln!(
        body,
        "<th>paired difference [95% CI]</th><th>seeds agreeing</th><th>test tasks</th>\
         <th>tasks for ±{TARGET_HALF_WIDTH} (projected)</th></tr>"
    );
    for d in &domain.differences {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}/{}</td><td>{}</td><td>{}</td></tr>",
            d.arm,
            d.metric,
            signed(&d.estimate),
            d.seeds_agreeing,
            d.seeds,
            d.tasks,
            sized(d)
        );
    }
    body.push_str(
        "</table>\n<table><tr><th>condition</th><th>final − start [95% CI]</th><th>seeds agreeing</th></tr>\n",
    );
    for m in &domain.movements {
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}/{}</td></tr>",
            m.arm,
            signed(&m.estimate),
            m.seeds_agreeing,
            m.seeds
        );
    }
    body.push_str("</table>\n<table><tr><th>condition</th><th>rollouts to the weight-only peak, per seed</th></tr>\n");
    for peak in &domain.peak_rollouts {
        let cells: Vec<String> =
            peak.per_seed.iter().map(|r| r.map_or("not reached".to_string(), |r| r.to_string())).collect();
        let _ = writeln!(body, "<tr><td>{}</td><td>{}</td></tr>", peak.arm, cells.join(", "));
    }
    body.push_str("</table>\n<table><tr><th>seed</th><th>cpu</th><th>whale</th></tr>\n");
    for seed in &domain.provenance {
        let commit = seed.whale.commit.as_deref().map_or(String::new(), |c| format!(" ({})", &c[..c.len().min(12)]));
        let cpus: Vec<String> = seed.cpus.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}{commit}</td></tr>",
            seed.seed,
            cpus.join("; "),
            seed.whale.version
        );
    }
    body.push_str("</table>\n");
    body
}

fn html(study: &Study, body: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>whale study</title><style>body{{font-family:sans-serif}}\
         table{{border-collapse:collapse;margin:1em 0}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style></head>\
         <body><h1>whale study</h1><p>seeds {:?}{}; differences paired over test tasks, pooled over seeds \
         (bootstrap over seeds, then tasks within seeds). Curves: the mean over seeds, the band their range. \
         Coupling: each harness the WHALE run accepted, scored on the test split under each weights it held at \
         a phase boundary.</p>\n{body}</body></html>\n",
        study.seeds,
        if study.quick { ", --quick" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::study::result::{ArmProvenance, ArmResult, SeedResult, WhaleBuild, FORMAT};
    use crate::study::summary::domain_study;
    use whale_core::{CpuInfo, Domain, Ledger};
    use whale_loop::condition::Condition;

    fn cpu(model: &str, features: &[&str]) -> CpuInfo {
        CpuInfo {
            model: model.to_string(),
            arch: "x86_64".to_string(),
            features: features.iter().map(|f| f.to_string()).collect(),
            missing: Vec::new(),
        }
    }

    fn ran_on(seed: u64, model: &str, features: &[&str]) -> SeedResult {
        let cpu = cpu(model, features);
        SeedResult {
            format: FORMAT,
            config: "math".to_string(),
            seed,
            config_hash: String::new(),
            whale: WhaleBuild::this(),
            cpu,
            wall_s: 1.0,
            arms: Vec::new(),
            coupling: None,
            config_used: serde_json::Value::Null,
        }
    }

    fn text_of(results: Vec<SeedResult>, missing: Vec<u64>) -> String {
        let domain = domain_study("math", Domain::Math, results, missing);
        text(&Study { seeds: vec![0, 1, 2, 3], arms: Vec::new(), quick: false, domains: vec![domain] })
    }

    #[test]
    fn the_text_says_which_cpu_each_seed_ran_on_and_which_seeds_are_missing() {
        let avx2 = ["avx2", "fma"];
        let one_family = text_of(vec![ran_on(0, "AMD EPYC 7B13", &avx2), ran_on(1, "AMD EPYC 7R32", &avx2)], vec![]);
        assert!(one_family.contains("  cpu: AMD EPYC 7B13 (x86_64, avx2, fma): seeds [0]\n"), "{one_family}");
        assert!(one_family.contains("  cpu: AMD EPYC 7R32 (x86_64, avx2, fma): seeds [1]\n"), "{one_family}");
        assert!(!one_family.contains("families") && !one_family.contains("missing"), "{one_family}");

        let results = vec![
            ran_on(0, "AMD EPYC 7B13", &avx2),
            ran_on(1, "Xeon", &["avx2", "fma", "avx512f"]),
            ran_on(2, "AMD EPYC 7B13", &avx2),
        ];
        let two_families = text_of(results, vec![3]);
        assert!(two_families.contains("  cpu: AMD EPYC 7B13 (x86_64, avx2, fma): seeds [0, 2]\n"), "{two_families}");
        assert!(two_families.contains("the seeds ran on 2 CPU families"), "{two_families}");
        assert!(two_families.contains("  missing seeds [3]: no result file yet\n"), "{two_families}");
    }

    #[test]
    fn a_seed_whose_arms_finished_on_two_machines_is_listed_under_both() {
        let arm = |condition, model: &str| ArmResult {
            condition,
            algorithm: None,
            ledger: Ledger::default(),
            evaluations: Vec::new(),
            ran: Some(ArmProvenance { cpu: cpu(model, &["avx2"]), whale: WhaleBuild::this(), wall_s: 1.0 }),
            test_split: None,
        };
        let split = SeedResult {
            arms: vec![arm(Condition::Whale, "Xeon"), arm(Condition::WeightOnly, "EPYC")],
            ..ran_on(0, "EPYC", &["avx2"])
        };
        let text = text_of(vec![split, ran_on(1, "EPYC", &["avx2"])], vec![]);
        assert!(text.contains("  cpu: Xeon (x86_64, avx2): seeds [0]\n"), "{text}");
        assert!(text.contains("  cpu: EPYC (x86_64, avx2): seeds [0, 1]\n"), "{text}");
        assert!(text.contains("  seed 0: its arms finished on 2 CPUs\n"), "{text}");
        assert!(!text.contains("seed 1: its arms"), "{text}");
    }
}

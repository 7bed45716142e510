//! The stock harnesses: hand-written starting points for each domain, compiled into the binary
//! so that `whale harness run math/plain` works anywhere. Each domain has a deliberately plain
//! harness (minimal prompt, one model call, weak answer parsing — what a harness search should
//! improve on) and stronger ones built on the prompts the default base model was trained with.
//! The sources live in `harnesses/<domain>/<name>.js` at the repository root.

use crate::Harness;
use whale_core::Domain;

/// One stock harness, named `<domain>/<name>` after its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StockHarness {
    pub name: &'static str,
    pub domain: Domain,
    pub source: &'static str,
}

impl StockHarness {
    /// The harness as a runnable value, identified by its content hash.
    pub fn harness(&self) -> Harness {
        Harness::from_source(self.source)
    }
}

macro_rules! stock {
    ($domain:ident, $file:literal) => {
        StockHarness {
            name: concat!(stringify!($domain), "/", $file),
            domain: domain!($domain),
            source: include_str!(concat!("../../../harnesses/", stringify!($domain), "/", $file, ".js")),
        }
    };
}

macro_rules! domain {
    (math) => {
        Domain::Math
    };
    (chess) => {
        Domain::Chess
    };
    (qa) => {
        Domain::Qa
    };
}

/// Every stock harness, by domain, the plain one first.
pub const STOCK_HARNESSES: [StockHarness; 18] = [
    stock!(math, "plain"),
    stock!(math, "calculator"),
    stock!(math, "vote"),
    stock!(math, "verify"),
    stock!(math, "fewshot"),
    stock!(math, "expression"),
    stock!(math, "boxed"),
    stock!(chess, "plain"),
    stock!(chess, "legal-moves"),
    stock!(chess, "san-moves"),
    stock!(chess, "board"),
    stock!(chess, "vote"),
    stock!(qa, "plain"),
    stock!(qa, "search"),
    stock!(qa, "rewrite"),
    stock!(qa, "two-hop"),
    stock!(qa, "passages"),
    stock!(qa, "fewshot"),
];

/// The stock harness called `name` (`math/plain`).
pub fn stock_harness(name: &str) -> Option<&'static StockHarness> {
    STOCK_HARNESSES.iter().find(|stock| stock.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{validate, Limits};

    #[test]
    fn every_stock_harness_validates_and_its_meta_names_its_file() {
        for stock in &STOCK_HARNESSES {
            let info = validate(stock.source, &Limits::default()).unwrap_or_else(|e| panic!("{}: {e}", stock.name));
            let meta = info.meta.unwrap_or_else(|| panic!("{}: no meta", stock.name));
            let file = stock.name.rsplit('/').next().unwrap_or_default();
            assert_eq!(meta["name"], file, "{}", stock.name);
            assert!(meta["description"].as_str().is_some_and(|d| !d.is_empty()), "{}", stock.name);
            assert!(stock.name.starts_with(&format!("{}/", stock.domain)), "{}", stock.name);
            assert_eq!(stock.harness().id, info.hash);
        }
    }

    #[test]
    fn each_domain_has_a_plain_harness_and_stronger_ones() {
        for domain in Domain::ALL {
            let names: Vec<&str> = STOCK_HARNESSES.iter().filter(|s| s.domain == domain).map(|s| s.name).collect();
            assert_eq!(names[0], format!("{domain}/plain"));
            assert!((3..=7).contains(&names.len()), "{names:?}");
        }
        assert_eq!(stock_harness("qa/two-hop").map(|s| s.domain), Some(Domain::Qa));
        assert_eq!(stock_harness("qa/nonexistent"), None);
    }
}

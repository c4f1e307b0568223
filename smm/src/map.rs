//! Shared addresses and the memory map: which hosts hold a copy of each page.
//!
//! The map file is line oriented (documented in `docs/smm.md`):
//!
//! ```text
//! # comment to end of line
//! 0-15   0 1 2        # pages 0..=15 are held by hosts 0, 1 and 2
//! 16     alpha        # hosts may be named (names from the cluster config)
//! ```

use isotach_proto::topology::{HostId, Topology};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use thiserror::Error;

/// A shared address: a page and a variable slot in it. Every slot holds up to 64 bits; a
/// 32-bit access uses the low half.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Addr(u64);

impl Addr {
    /// The address of `slot` in `page`.
    pub fn new(page: u32, slot: u32) -> Self {
        Self(u64::from(page) << 32 | u64::from(slot))
    }
    /// From the packed form carried in srefs.
    pub fn from_raw(raw: u64) -> Self {
        Self(raw)
    }
    /// The packed form carried in srefs.
    pub fn raw(self) -> u64 {
        self.0
    }
    /// The page.
    pub fn page(self) -> u32 {
        (self.0 >> 32) as u32
    }
    /// The slot within the page.
    pub fn slot(self) -> u32 {
        self.0 as u32
    }
}

impl std::fmt::Display for Addr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.page(), self.slot())
    }
}

/// Most pages a map may name.
pub const PAGES_MAX: u32 = 1 << 20;

/// A map-file error: where and what.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}:{line}:{column}: {message}")]
pub struct MapError {
    /// The file (or `<memory>`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What is wrong.
    pub message: String,
}

/// Pages and their copysets, as read from a map file (copysets in file order).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryMap {
    /// `pages[first] = (last, copyset)`: ranges, non-overlapping.
    ranges: BTreeMap<u32, (u32, Vec<HostId>)>,
}

impl MemoryMap {
    /// Parses map text; `hosts` names the hosts (index = host id), `file` names the text in
    /// errors.
    pub fn parse(text: &str, file: &str, hosts: &[String]) -> Result<Self, MapError> {
        let mut map = Self::default();
        for (i, raw_line) in text.lines().enumerate() {
            let line = raw_line.split('#').next().unwrap_or("");
            let mut words = Words::new(line);
            let Some((col, range)) = words.next() else {
                continue;
            };
            let err = |column: usize, message: String| MapError {
                file: file.to_string(),
                line: i + 1,
                column,
                message,
            };
            let (first, last) = parse_range(range).map_err(|m| err(col, m))?;
            let mut copyset = Vec::new();
            for (col, word) in words {
                let host = parse_host(word, hosts).map_err(|m| err(col, m))?;
                if copyset.contains(&host) {
                    return Err(err(col, format!("host `{word}` listed twice")));
                }
                copyset.push(host);
            }
            if copyset.is_empty() {
                return Err(err(
                    line.len() + 1,
                    "a page range needs at least one host".into(),
                ));
            }
            map.insert(first, last, copyset).map_err(|m| err(col, m))?;
        }
        Ok(map)
    }

    /// Reads a map file.
    pub fn load(path: &Path, hosts: &[String]) -> Result<Self, MapError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| MapError {
            file: file.clone(),
            line: 0,
            column: 0,
            message: format!("cannot read: {e}"),
        })?;
        Self::parse(&text, &file, hosts)
    }

    /// Adds pages `first..=last` held by `copyset`.
    pub fn insert(&mut self, first: u32, last: u32, copyset: Vec<HostId>) -> Result<(), String> {
        if first > last || last >= PAGES_MAX {
            return Err(format!(
                "bad page range {first}-{last} (pages below {PAGES_MAX})"
            ));
        }
        if copyset.is_empty() {
            return Err("empty copyset".into());
        }
        let before = self.ranges.range(..=last).next_back();
        if let Some((&f, &(l, _))) = before
            && l >= first
        {
            return Err(format!("pages {first}-{last} overlap pages {f}-{l}"));
        }
        self.ranges.insert(first, (last, copyset));
        Ok(())
    }

    /// The copyset of `page` in map order, if mapped.
    pub fn copyset(&self, page: u32) -> Option<&[HostId]> {
        let (_, (last, copyset)) = self.ranges.range(..=page).next_back()?;
        (page <= *last).then_some(copyset.as_slice())
    }

    /// Every mapped page range with its copyset.
    pub fn ranges(&self) -> impl Iterator<Item = (u32, u32, &[HostId])> {
        self.ranges.iter().map(|(&f, (l, c))| (f, *l, c.as_slice()))
    }

    /// Checks every host exists in `topology`.
    pub fn check_hosts(&self, topology: &Topology) -> Result<(), String> {
        for (first, last, copyset) in self.ranges() {
            if let Some(h) = copyset
                .iter()
                .find(|&&h| usize::from(h) >= topology.host_count())
            {
                return Err(format!(
                    "pages {first}-{last}: host {h} is not in the topology"
                ));
            }
        }
        Ok(())
    }
}

/// The map as one host sees it: copysets ordered nearest first. The map itself is shared (an
/// `Arc`); each copyset is ordered for this host the first time it is asked for and kept, so a
/// host holds the orderings of the pages it uses, not of the whole map (the simulator runs
/// thousands of hosts over a map with a page per host).
#[derive(Debug, Clone)]
pub struct LocalMap {
    host: HostId,
    map: Arc<MemoryMap>,
    topology: Arc<Topology>,
    /// Ordered copysets by the first page of their range.
    /// (A node is used by one thread at a time: no lock.)
    ordered: RefCell<FxHashMap<u32, Arc<[HostId]>>>,
}

impl LocalMap {
    /// `map` as `host` sees it: every copyset ordered by logical distance from `host` (ties:
    /// host id; the host itself, if a holder, comes first).
    pub fn new(map: Arc<MemoryMap>, topology: Arc<Topology>, host: HostId) -> Self {
        Self {
            host,
            map,
            topology,
            ordered: RefCell::new(FxHashMap::default()),
        }
    }

    /// This host.
    pub fn host(&self) -> HostId {
        self.host
    }

    /// The nearest-first copyset of `page`, if mapped.
    pub fn copyset(&self, page: u32) -> Option<Arc<[HostId]>> {
        let (&first, (last, copyset)) = self.map.ranges.range(..=page).next_back()?;
        if page > *last {
            return None;
        }
        let mut cache = self.ordered.borrow_mut();
        let ordered = cache.entry(first).or_insert_with(|| {
            let (host, topology) = (self.host, &self.topology);
            let mut ordered = copyset.clone();
            ordered.sort_by_key(|&h| (h != host, topology.distance(host, h), h));
            ordered.into()
        });
        Some(Arc::clone(ordered))
    }

    /// Is `page` mapped? (No ordering made.)
    pub fn is_mapped(&self, page: u32) -> bool {
        self.map.copyset(page).is_some()
    }

    /// Pages this host holds a copy of.
    pub fn local_pages(&self) -> impl Iterator<Item = u32> + '_ {
        self.map
            .ranges
            .iter()
            .filter(|(_, (_, c))| c.contains(&self.host))
            .flat_map(|(&f, (l, _))| f..=*l)
    }
}

fn parse_range(word: &str) -> Result<(u32, u32), String> {
    let page = |s: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("`{s}` is not a page number"))
    };
    match word.split_once('-') {
        Some((a, b)) => Ok((page(a)?, page(b)?)),
        None => page(word).map(|p| (p, p)),
    }
}

fn parse_host(word: &str, hosts: &[String]) -> Result<HostId, String> {
    if let Some(i) = hosts.iter().position(|h| h == word) {
        return Ok(i as HostId);
    }
    match word.parse::<u16>() {
        Ok(h) if usize::from(h) < hosts.len() || hosts.is_empty() => Ok(h),
        _ => Err(format!("no host named `{word}`")),
    }
}

/// Whitespace-separated words with their 1-based columns.
struct Words<'a> {
    line: &'a str,
    at: usize,
}

impl<'a> Words<'a> {
    fn new(line: &'a str) -> Self {
        Self { line, at: 0 }
    }
}

impl<'a> Iterator for Words<'a> {
    type Item = (usize, &'a str);
    fn next(&mut self) -> Option<Self::Item> {
        let rest = &self.line[self.at..];
        let start = self.at + rest.find(|c: char| !c.is_whitespace())?;
        let len = self.line[start..]
            .find(char::is_whitespace)
            .unwrap_or(self.line.len() - start);
        self.at = start + len;
        Some((start + 1, &self.line[start..start + len]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        ["alpha", "beta", "gamma", "delta"]
            .map(String::from)
            .to_vec()
    }

    #[test]
    fn parses_ranges_names_and_comments() {
        let text = "# map\n0-3 0 1   # replicated\n4 gamma\n\n10-12 delta alpha\n";
        let m = MemoryMap::parse(text, "m", &names()).unwrap();
        assert_eq!(m.copyset(2), Some(&[0, 1][..]));
        assert_eq!(m.copyset(4), Some(&[2][..]));
        assert_eq!(m.copyset(5), None);
        assert_eq!(m.copyset(11), Some(&[3, 0][..]));
    }

    #[test]
    fn errors_name_line_and_column() {
        let e = MemoryMap::parse("0 0\n1 zeta\n", "m.map", &names()).unwrap_err();
        assert_eq!((e.line, e.column), (2, 3), "{e}");
        assert!(e.to_string().starts_with("m.map:2:3:"), "{e}");
        let e = MemoryMap::parse("0-4 0\n3 1\n", "m", &names()).unwrap_err();
        assert!(e.message.contains("overlap"), "{e}");
        let e = MemoryMap::parse("x 0\n", "m", &names()).unwrap_err();
        assert_eq!(e.column, 1);
        let e = MemoryMap::parse("0 1 1\n", "m", &names()).unwrap_err();
        assert!(e.message.contains("twice"));
        let e = MemoryMap::parse("  7\n", "m", &names()).unwrap_err();
        assert!(e.message.contains("at least one host"));
    }

    #[test]
    fn local_map_orders_nearest_first() {
        // Hosts 0,1,2 round-robin over 3 switches in a line: host 2 is farthest from host 0.
        let topo = Topology::line(3, 3).unwrap();
        let mut m = MemoryMap::default();
        m.insert(0, 0, vec![2, 1, 0]).unwrap();
        m.insert(1, 1, vec![2, 1]).unwrap();
        let l = LocalMap::new(Arc::new(m), Arc::new(topo), 0);
        assert_eq!(l.copyset(0).as_deref(), Some(&[0, 1, 2][..]));
        assert_eq!(l.copyset(1).as_deref(), Some(&[1, 2][..]));
        assert_eq!(l.copyset(2), None);
        assert_eq!(l.local_pages().collect::<Vec<_>>(), vec![0]);
        // Ordered once, then kept; a clone keeps what was ordered.
        assert!(Arc::ptr_eq(&l.copyset(0).unwrap(), &l.copyset(0).unwrap()));
        assert_eq!(l.clone().copyset(1).as_deref(), Some(&[1, 2][..]));
    }

    #[test]
    fn addr_packs_page_and_slot() {
        let a = Addr::new(7, 9);
        assert_eq!((a.page(), a.slot()), (7, 9));
        assert_eq!(Addr::from_raw(a.raw()), a);
    }
}

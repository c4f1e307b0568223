//! The protocol crate stays sans-IO: its dependency list is a fixed allow-list, so no runtime,
//! socket or TLS crate can slip into its tree (`cargo tree -p isotach-am-proto -e normal`
//! shows the same).

#[test]
fn dependencies_are_the_pure_allow_list() {
    // `isotach-bufpool` has no dependencies of its own.
    const ALLOWED: [&str; 5] = [
        "crc32fast",
        "isotach-bufpool",
        "rustc-hash",
        "serde",
        "thiserror",
    ];
    let manifest = include_str!("../Cargo.toml");
    let mut section = "";
    let mut deps = Vec::new();
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
            continue;
        }
        if section == "[dependencies]"
            && let Some((name, _)) = line.split_once('=')
        {
            deps.push(name.trim().trim_end_matches(".workspace").to_string());
        }
    }
    deps.sort();
    assert_eq!(
        deps, ALLOWED,
        "isotach-am-proto must not depend on I/O crates"
    );
}

//! docs/lock-service.md's flag table lists every flag the binary takes, with
//! its default: the table and `--help` cannot drift apart.

use std::process::Command;

#[test]
fn the_flag_table_lists_every_flag_and_its_default() {
    let help = Command::new(env!("CARGO_BIN_EXE_demo-lock-service")).arg("--help").output().unwrap();
    assert!(help.status.success());
    let help = String::from_utf8(help.stdout).unwrap();
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/lock-service.md")).unwrap();
    let mut flags = 0;
    for line in help.lines().map(str::trim).filter(|l| l.starts_with("--")) {
        let flag = line.split_whitespace().next().unwrap();
        if flag == "--help" || flag == "--version" {
            continue;
        }
        flags += 1;
        let row = docs
            .lines()
            .find(|l| l.starts_with(&format!("| `{flag}` |")))
            .unwrap_or_else(|| panic!("docs/lock-service.md has no row for {flag}"));
        if let Some(default) = line.split("[default: ").nth(1).and_then(|d| d.split(']').next()) {
            assert!(
                row.contains(&format!("`{default}`")),
                "{flag}: the row does not say its default {default}: {row}"
            );
        }
    }
    assert!(flags >= 5, "{help}");
}

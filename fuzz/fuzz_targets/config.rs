//! Config parsing: any TOML text is either refused with an error or gives a config that
//! validates, and that survives `--print-config` (TOML out, parsed back: the same config).
//! No input may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use router_server::config::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(cfg) = Config::from_toml_str(text) else {
        return;
    };
    let printed = toml::to_string_pretty(&cfg).expect("a valid config prints");
    let back = Config::from_toml_str(&printed)
        .unwrap_or_else(|e| panic!("printed config does not parse: {e}\n{printed}"));
    assert_eq!(back, cfg, "{printed}");
});

//! A short agent workload through the real `router` against real `enginesim` processes,
//! measured by `routerbench agent` from the engines' own usage reports.

use router_tests::*;
use std::process::Command;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_workload_sticks_and_hits_cache() {
    let dir = TempDir::new("agent");
    let ports: Vec<std::net::SocketAddr> = (0..4).map(|_| free_addr()).collect();
    let mut cmd = Command::new(bin("enginesim"));
    for p in &ports {
        cmd.arg("--listen").arg(p.to_string());
    }
    cmd.args([
        "--speed",
        "20",
        "--capacity-tokens",
        "100000",
        "--prefill-tps",
        "5000",
    ]);
    cmd.stderr(std::fs::File::create(dir.path("enginesim.log")).unwrap());
    let engines = Proc {
        child: cmd.spawn().unwrap(),
        log: dir.path("enginesim.log"),
    };
    for p in &ports {
        wait_http(*p, &engines).await;
    }
    let addr = free_addr();
    let mut toml = format!("listen = \"{addr}\"\n");
    for p in &ports {
        toml.push_str(&format!(
            "[[upstreams]]\nurl = \"http://{p}\"\ncapacity_tokens = 100000\n"
        ));
    }
    let _router = start_router(&dir, &toml, &[], addr).await;
    let out = dir.path("report.json");
    let status = tokio::task::spawn_blocking({
        let out = out.clone();
        move || {
            Command::new(bin("routerbench"))
                .args([
                    "agent",
                    "--url",
                    &format!("http://{addr}"),
                    "--developers",
                    "6",
                    "--duration",
                    "15",
                ])
                .args([
                    "--scale",
                    "0.1",
                    "--time-scale",
                    "20",
                    "--seed",
                    "3",
                    "--json",
                ])
                .arg(&out)
                .status()
                .unwrap()
        }
    })
    .await
    .unwrap();
    assert!(status.success());
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    let turns = r["turns"].as_u64().unwrap();
    let sticky = r["stickiness"].as_f64().unwrap();
    let cached = r["cached_share"].as_f64().unwrap();
    let oracle = r["oracle_share"].as_f64().unwrap();
    assert!(turns >= 50, "only {turns} turns: {r}");
    assert!(r["errors"].as_object().unwrap().is_empty(), "{r}");
    assert!(sticky >= 0.9, "stickiness {sticky}: {r}");
    assert!(
        cached >= oracle - 0.05,
        "cached {cached} vs oracle {oracle}: {r}"
    );
    assert!(cached >= 0.7, "cached {cached}: {r}");
}

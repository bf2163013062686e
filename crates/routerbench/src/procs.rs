//! Starting and stopping the processes a comparison needs: engine simulators, routers,
//! nginx. Every child is killed when its handle drops.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process killed on drop.
pub struct Proc {
    child: Child,
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SIGTERM first: nginx's master then stops its workers (killed outright, it leaves
        // them running); whatever has not exited within 2 s is killed.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The directory holding this executable, where `router` and `enginesim` are built too.
pub fn bin_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Path of a sibling binary, or an error saying how to build it.
pub fn sibling(name: &str) -> anyhow::Result<PathBuf> {
    let p = bin_dir().join(name);
    if !p.exists() {
        anyhow::bail!(
            "{} not found; build it with `cargo build --release --bins`",
            p.display()
        );
    }
    Ok(p)
}

/// Spawns a command with its stderr in `log`.
pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> anyhow::Result<Proc> {
    let f = std::fs::File::create(log)?;
    cmd.stdout(Stdio::null()).stderr(f);
    let child = cmd
        .spawn()
        .map_err(|e| anyhow::anyhow!("starting {name}: {e}"))?;
    Ok(Proc { child })
}

/// Waits until `addr` accepts connections.
pub async fn wait_port(addr: SocketAddr, what: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    anyhow::bail!("{what} did not start listening on {addr}")
}

/// A free loopback port.
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The nginx binary, installed from Debian's packages when missing.
pub fn nginx() -> anyhow::Result<PathBuf> {
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return Ok(PathBuf::from(p));
        }
    }
    eprintln!(
        "nginx not found: installing it from Debian's packages (apt-get install nginx-light)"
    );
    let ok = Command::new("sh")
        .args(["-c", "DEBIAN_FRONTEND=noninteractive apt-get install -y nginx-light >/dev/null 2>&1 || (apt-get update >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y nginx-light >/dev/null 2>&1)"])
        .status()?
        .success();
    if ok && Path::new("/usr/sbin/nginx").exists() {
        return Ok(PathBuf::from("/usr/sbin/nginx"));
    }
    anyhow::bail!("nginx is not installed and could not be installed (run as root: apt-get install nginx-light)")
}

/// Starts nginx with `least_conn` over `upstreams` (host:port), listening on `port`.
pub async fn start_nginx(dir: &Path, port: u16, upstreams: &[String]) -> anyhow::Result<Proc> {
    let bin = nginx()?;
    let servers: String = upstreams
        .iter()
        .map(|u| format!("    server {u} max_fails=0;\n"))
        .collect();
    let conf = format!(
        "worker_processes 2;\ndaemon off;\npid {dir}/nginx.pid;\nerror_log {dir}/nginx-error.log warn;\nevents {{ worker_connections 4096; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {dir}/body;\n  proxy_temp_path {dir}/proxy;\n  fastcgi_temp_path {dir}/fcgi;\n  uwsgi_temp_path {dir}/uwsgi;\n  scgi_temp_path {dir}/scgi;\n\
  client_max_body_size 64m;\n  client_body_buffer_size 1m;\n\
  upstream engines {{\n    least_conn;\n{servers}    keepalive 256;\n  }}\n\
  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://engines;\n      proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      proxy_buffering off;\n      proxy_request_buffering on;\n      proxy_read_timeout 600s;\n    }}\n  }}\n}}\n",
        dir = dir.display()
    );
    let path = dir.join("nginx.conf");
    std::fs::write(&path, conf)?;
    let mut cmd = Command::new(bin);
    cmd.arg("-c").arg(&path).arg("-p").arg(dir);
    let child = spawn("nginx", cmd, &dir.join("nginx.log"))?;
    wait_port(SocketAddr::from(([127, 0, 0, 1], port)), "nginx").await?;
    Ok(child)
}

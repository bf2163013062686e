//! `routerctl probe URL`: one HTTP GET, exit status 0 on a 2xx answer. The container image
//! has no shell or curl; its health check runs this.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// GETs `url` (`http://host:port/path`) and returns the status code.
pub async fn get(url: &str, timeout: Duration) -> anyhow::Result<u16> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| anyhow::anyhow!("probe takes an http:// URL"))?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let run = async {
        let mut s = tokio::net::TcpStream::connect(authority).await?;
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: {authority}\r\nconnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await?;
        let mut head = [0u8; 64];
        let mut n = 0;
        while n < 12 {
            let k = s.read(&mut head[n..]).await?;
            if k == 0 {
                break;
            }
            n += k;
        }
        let line = String::from_utf8_lossy(&head[..n]).into_owned();
        let code = line
            .strip_prefix("HTTP/1.1 ")
            .or_else(|| line.strip_prefix("HTTP/1.0 "))
            .and_then(|r| r.get(..3))
            .and_then(|c| c.parse::<u16>().ok())
            .ok_or_else(|| anyhow::anyhow!("not an HTTP answer: {line:?}"))?;
        anyhow::Ok(code)
    };
    tokio::time::timeout(timeout, run)
        .await
        .map_err(|_| anyhow::anyhow!("no answer from {url} within {timeout:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn answering(status: &'static str) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(status.as_bytes()).await;
        });
        format!("http://{addr}/health")
    }

    #[tokio::test]
    async fn reads_the_status_code_and_times_out() {
        let url = answering("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n").await;
        assert_eq!(get(&url, Duration::from_secs(2)).await.unwrap(), 200);
        let url = answering("HTTP/1.1 503 Service Unavailable\r\n\r\n").await;
        assert_eq!(get(&url, Duration::from_secs(2)).await.unwrap(), 503);
        // A listener that never answers: a timeout, not a hang.
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/health", l.local_addr().unwrap());
        assert!(get(&url, Duration::from_millis(200)).await.is_err());
        assert!(get("https://x/", Duration::from_millis(200)).await.is_err());
    }
}

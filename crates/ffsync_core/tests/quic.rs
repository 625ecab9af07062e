//! QUIC transport over loopback: mutual certificates, streams both ways, clean end,
//! and the timeout a silent UDP path produces.

use std::time::Duration;

use ffsync_core::identity;
use ffsync_core::quic::{self, QuicIdentity, QuicListener, CLOSE_DONE};

fn id(label: &str) -> (QuicIdentity, Vec<u8>) {
    let i = identity::generate(label).unwrap();
    let der = rustls_pki_types::pem::PemObject::from_pem_slice(i.cert_pem.as_bytes())
        .map(|c: rustls_pki_types::CertificateDer<'static>| c.as_ref().to_vec())
        .unwrap();
    (QuicIdentity::from_pem(&i.cert_pem, &i.key_pem).unwrap(), der)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

const IDLE: Duration = Duration::from_secs(10);

#[test]
fn streams_carry_data_both_ways_with_mutual_identities() {
    rt().block_on(async {
        let (server_id, server_der) = id("server");
        let (client_id, client_der) = id("client");
        let listener = QuicListener::bind("127.0.0.1:0".parse().unwrap(), &server_id, IDLE).unwrap();
        let addr = listener.local_addr().unwrap();
        // 3 MiB of patterned data: more than one flow-control window's first grant.
        let payload: Vec<u8> = (0..3 << 20)
            .map(|i: u32| (i.wrapping_mul(2654435761) >> 13) as u8)
            .collect();
        let expect = payload.clone();
        let server = tokio::spawn(async move {
            let conn = listener.accept().await.unwrap().unwrap();
            assert_eq!(conn.peer_certificate().unwrap(), client_der);
            let mut total = Vec::new();
            let mut streams = 0;
            while let Some(s) = conn.accept_stream().await.unwrap() {
                streams += 1;
                let mut got = Vec::new();
                while let Some(b) = s.read(64 << 10).await.unwrap() {
                    got.extend_from_slice(&b);
                }
                s.write_all(&[b"ack:", &(got.len() as u64).to_le_bytes()])
                    .await
                    .unwrap();
                s.finish().await.unwrap();
                total.push(got);
                if streams == 2 {
                    break;
                }
            }
            conn.closed().await;
            total
        });
        let conn = quic::connect(addr, &client_id, Duration::from_secs(5), IDLE)
            .await
            .unwrap();
        assert_eq!(conn.peer_certificate().unwrap(), server_der);
        for part in [&payload[..], b"second stream"] {
            let s = conn.open_stream().await.unwrap();
            s.write_all(&[part]).await.unwrap();
            s.finish().await.unwrap();
            let mut reply = Vec::new();
            while let Some(b) = s.read(1024).await.unwrap() {
                reply.extend_from_slice(&b);
            }
            assert_eq!(&reply[..4], b"ack:");
            assert_eq!(u64::from_le_bytes(reply[4..12].try_into().unwrap()), part.len() as u64);
        }
        let (sent, _) = conn.wire_bytes();
        assert!(sent >= payload.len() as u64, "wire bytes count what went out: {sent}");
        conn.close(CLOSE_DONE, "done").await;
        let got = server.await.unwrap();
        assert_eq!(got[0], expect);
        assert_eq!(got[1], b"second stream");
    });
}

#[test]
fn silent_udp_port_times_out_with_etimedout() {
    rt().block_on(async {
        // A bound UDP socket that never answers: like a firewall dropping UDP.
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let (client_id, _) = id("client");
        let t = std::time::Instant::now();
        let err = quic::connect(sink.local_addr().unwrap(), &client_id, Duration::from_millis(600), IDLE)
            .await
            .err()
            .expect("no handshake with a silent peer");
        assert_eq!(err.code(), "ETIMEDOUT");
        assert!(err.to_string().contains("no QUIC answer"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5));
    });
}

#[test]
fn closed_listener_ends_accept_and_peer_reset_surfaces() {
    rt().block_on(async {
        let (server_id, _) = id("server");
        let (client_id, _) = id("client");
        let listener =
            std::sync::Arc::new(QuicListener::bind("127.0.0.1:0".parse().unwrap(), &server_id, IDLE).unwrap());
        let addr = listener.local_addr().unwrap();
        let l2 = listener.clone();
        let server = tokio::spawn(async move {
            let conn = l2.accept().await.unwrap().unwrap();
            let s = conn.accept_stream().await.unwrap().unwrap();
            let first = s.read(16).await.unwrap().unwrap();
            assert_eq!(&first[..], b"hello");
            // The client aborts: the next read fails instead of hanging or reading an end.
            let e = loop {
                match s.read(16).await {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("an aborted stream must not look finished"),
                    Err(e) => break e,
                }
            };
            assert!(matches!(e.code(), "ECONNRESET" | "ECLOSED"), "{}: {e}", e.code());
        });
        let conn = quic::connect(addr, &client_id, Duration::from_secs(5), IDLE)
            .await
            .unwrap();
        let s = conn.open_stream().await.unwrap();
        s.write_all(&[b"hello"]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        s.reset();
        server.await.unwrap();
        listener.close();
        assert!(listener.accept().await.is_none());
        conn.close(CLOSE_DONE, "done").await;
    });
}

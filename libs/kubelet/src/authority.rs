//! Connections whose HTTP/2 `:authority` is a socket path.
//!
//! kubelet's plugin watcher dials a plugin's registration socket by its bare
//! path, so gRPC-Go sends that path as the request's `:authority`. A path is
//! no URI authority, and h2 (under tonic) answers such a request with
//! RST_STREAM PROTOCOL_ERROR: without this adapter kubelet never learns the
//! plugin's name and the plugin is never registered.
//!
//! [`Lenient`] sits between the socket and the HTTP/2 server. It passes
//! every byte through except the client's header blocks (HEADERS and its
//! CONTINUATION frames): those it decodes with the client's HPACK context,
//! replaces an `:authority` that is not a valid authority with `localhost`
//! (what gRPC-Go sends for `unix:` targets), and encodes again with its own
//! context towards the server. Every block is re-encoded, so the two
//! compression contexts stay each consistent with its peer. What the server
//! writes passes untouched.

use std::borrow::Cow;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, BytesMut};
use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client connection preface (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE's initial value, which the server keeps.
const MAX_FRAME: usize = 16_384;
/// The largest header block assembled; beyond it the connection is refused.
const MAX_BLOCK: usize = 1 << 20;
/// What replaces an `:authority` that is no authority.
pub const AUTHORITY: &[u8] = b"localhost";

/// A unix listener's connections, each behind a [`Lenient`].
pub fn incoming(
    listener: tokio::net::UnixListener,
) -> impl Stream<Item = io::Result<Lenient<tokio::net::UnixStream>>> {
    tokio_stream::wrappers::UnixListenerStream::new(listener).map(|c| c.map(Lenient::new))
}

/// A header block being assembled from HEADERS and CONTINUATION frames.
struct Block {
    stream: u32,
    end_stream: bool,
    priority: Option<[u8; 5]>,
    fragment: BytesMut,
}

/// A server-side connection that makes the client's `:authority` one h2
/// accepts.
pub struct Lenient<S> {
    io: S,
    /// Read from the client, not yet parsed.
    raw: BytesMut,
    /// Parsed (and rewritten), for the server to read.
    ready: BytesMut,
    preface_seen: bool,
    block: Option<Block>,
    decoder: loona_hpack::Decoder<'static>,
    encoder: loona_hpack::Encoder<'static>,
    eof: bool,
}

fn protocol(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl<S> Lenient<S> {
    pub fn new(io: S) -> Lenient<S> {
        Lenient {
            io,
            raw: BytesMut::new(),
            ready: BytesMut::new(),
            preface_seen: false,
            block: None,
            decoder: loona_hpack::Decoder::new(),
            encoder: loona_hpack::Encoder::new(),
            eof: false,
        }
    }

    /// Moves every whole frame of `raw` to `ready`, header blocks rewritten.
    fn parse(&mut self) -> io::Result<()> {
        if !self.preface_seen {
            if self.raw.len() < PREFACE_LEN {
                return Ok(());
            }
            self.ready
                .extend_from_slice(&self.raw.split_to(PREFACE_LEN));
            self.preface_seen = true;
        }
        while self.raw.len() >= FRAME_HEADER_LEN {
            let len = u32::from_be_bytes([0, self.raw[0], self.raw[1], self.raw[2]]) as usize;
            if self.raw.len() < FRAME_HEADER_LEN + len {
                break;
            }
            let mut frame = self.raw.split_to(FRAME_HEADER_LEN + len);
            let (kind, flags) = (frame[3], frame[4]);
            let stream = u32::from_be_bytes([frame[5], frame[6], frame[7], frame[8]]) & 0x7fff_ffff;
            let payload = frame.split_off(FRAME_HEADER_LEN);
            match kind {
                HEADERS => self.headers(stream, flags, payload)?,
                CONTINUATION => self.continuation(stream, flags, payload)?,
                _ if self.block.is_some() => {
                    return Err(protocol(format!(
                        "frame of type {kind:#x} inside a header block (RFC 9113 §6.10)"
                    )));
                }
                _ => {
                    self.ready.extend_from_slice(&frame);
                    self.ready.extend_from_slice(&payload);
                }
            }
        }
        Ok(())
    }

    fn headers(&mut self, stream: u32, flags: u8, mut payload: BytesMut) -> io::Result<()> {
        if self.block.is_some() {
            return Err(protocol("HEADERS inside a header block".into()));
        }
        let mut pad = 0;
        if flags & PADDED != 0 {
            if payload.is_empty() {
                return Err(protocol("padded HEADERS without a pad length".into()));
            }
            pad = payload.get_u8() as usize;
        }
        let priority = if flags & PRIORITY != 0 {
            if payload.len() < 5 {
                return Err(protocol("HEADERS too short for its priority".into()));
            }
            let mut p = [0; 5];
            payload.copy_to_slice(&mut p);
            Some(p)
        } else {
            None
        };
        if pad > payload.len() {
            return Err(protocol("HEADERS padding longer than its payload".into()));
        }
        payload.truncate(payload.len() - pad);
        self.block = Some(Block {
            stream,
            end_stream: flags & END_STREAM != 0,
            priority,
            fragment: payload,
        });
        if flags & END_HEADERS != 0 {
            self.finish()?;
        }
        Ok(())
    }

    fn continuation(&mut self, stream: u32, flags: u8, payload: BytesMut) -> io::Result<()> {
        let block = match &mut self.block {
            Some(block) if block.stream == stream => block,
            _ => {
                return Err(protocol(format!(
                    "CONTINUATION on stream {stream} outside its header block"
                )));
            }
        };
        if block.fragment.len() + payload.len() > MAX_BLOCK {
            return Err(protocol(format!("header block over {MAX_BLOCK} bytes")));
        }
        block.fragment.extend_from_slice(&payload);
        if flags & END_HEADERS != 0 {
            self.finish()?;
        }
        Ok(())
    }

    /// Decodes the assembled block, mends its authority and writes it again
    /// as HEADERS and CONTINUATION frames of at most [`MAX_FRAME`] bytes.
    fn finish(&mut self) -> io::Result<()> {
        let block = self.block.take().expect("a block is open");
        let mut fields: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        self.decoder
            .decode_with_cb(&block.fragment, |name: Cow<[u8]>, value: Cow<[u8]>| {
                fields.push((name.into_owned(), value.into_owned()))
            })
            .map_err(|e| protocol(format!("HPACK: {e:?}")))?;
        for (name, value) in &mut fields {
            if name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
                *value = AUTHORITY.to_vec();
            }
        }
        let encoded = self
            .encoder
            .encode(fields.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let priority = block.priority.map(|p| p.to_vec()).unwrap_or_default();
        let first = (MAX_FRAME - priority.len()).min(encoded.len());
        let (head, mut rest) = encoded.split_at(first);
        let mut flags = if block.end_stream { END_STREAM } else { 0 };
        if block.priority.is_some() {
            flags |= PRIORITY;
        }
        if rest.is_empty() {
            flags |= END_HEADERS;
        }
        self.frame(HEADERS, flags, block.stream, &[&priority, head]);
        while !rest.is_empty() {
            let (chunk, after) = rest.split_at(MAX_FRAME.min(rest.len()));
            rest = after;
            let flags = if rest.is_empty() { END_HEADERS } else { 0 };
            self.frame(CONTINUATION, flags, block.stream, &[chunk]);
        }
        Ok(())
    }

    fn frame(&mut self, kind: u8, flags: u8, stream: u32, parts: &[&[u8]]) {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        self.ready.put_slice(&(len as u32).to_be_bytes()[1..]);
        self.ready.put_u8(kind);
        self.ready.put_u8(flags);
        self.ready.put_u32(stream);
        for p in parts {
            self.ready.put_slice(p);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Lenient<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready.split_to(n));
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // A truncated frame at the end goes through as it came.
                let rest = this.raw.split();
                if rest.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.ready = rest;
                continue;
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.io).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => {
                    this.raw.extend_from_slice(read.filled());
                    this.parse()?;
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Lenient<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Lenient<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend([kind, flags]);
        f.extend(stream.to_be_bytes());
        f.extend(payload);
        f
    }

    /// Feeds `bytes` through a [`Lenient`] and returns what the server reads.
    async fn through(bytes: Vec<u8>) -> io::Result<Vec<u8>> {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        client.write_all(&bytes).await?;
        drop(client);
        let mut out = Vec::new();
        Lenient::new(server).read_to_end(&mut out).await?;
        Ok(out)
    }

    type Fields = Vec<(Vec<u8>, Vec<u8>)>;

    /// The frames after the preface (type, flags), header blocks decoded.
    fn blocks(mut bytes: &[u8]) -> Vec<(u8, u8, Fields)> {
        assert_eq!(&bytes[..PREFACE.len()], PREFACE);
        bytes = &bytes[PREFACE.len()..];
        let mut decoder = loona_hpack::Decoder::new();
        let mut out = Vec::new();
        let mut open: Option<(u8, Vec<u8>)> = None;
        while !bytes.is_empty() {
            let len = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
            let (kind, flags) = (bytes[3], bytes[4]);
            let payload = &bytes[9..9 + len];
            bytes = &bytes[9 + len..];
            match kind {
                HEADERS => {
                    let skip = if flags & PRIORITY != 0 { 5 } else { 0 };
                    open = Some((flags, payload[skip..].to_vec()));
                }
                CONTINUATION => open.as_mut().expect("open").1.extend(payload),
                other => out.push((other, flags, Vec::new())),
            }
            if matches!(kind, HEADERS | CONTINUATION) && flags & END_HEADERS != 0 {
                let (flags, block) = open.take().expect("open");
                out.push((HEADERS, flags, decoder.decode(&block).expect("decodes")));
            }
        }
        out
    }

    fn request(authority: &[u8]) -> Vec<(&'static [u8], Vec<u8>)> {
        vec![
            (b":method", b"POST".to_vec()),
            (b":scheme", b"http".to_vec()),
            (
                b":path",
                b"/pluginregistration.Registration/GetInfo".to_vec(),
            ),
            (b":authority", authority.to_vec()),
            (b"content-type", b"application/grpc".to_vec()),
        ]
    }

    fn encode(
        encoder: &mut loona_hpack::Encoder<'static>,
        fields: &[(&'static [u8], Vec<u8>)],
    ) -> Vec<u8> {
        encoder.encode(fields.iter().map(|(n, v)| (*n, v.as_slice())))
    }

    #[tokio::test]
    async fn a_path_authority_becomes_localhost_and_the_rest_passes() {
        let path = b"/var/lib/kubelet/plugins_registry/gpu.deckhouse.io-reg.sock";
        let mut encoder = loona_hpack::Encoder::new();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(0x4, 0, 0, &[])); // SETTINGS
        bytes.extend(frame(
            HEADERS,
            END_HEADERS,
            1,
            &encode(&mut encoder, &request(path)),
        ));
        bytes.extend(frame(0x0, END_STREAM, 1, &[0, 0, 0, 0, 0])); // DATA
        // The second request's authority comes from the client's dynamic table.
        bytes.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            3,
            &encode(&mut encoder, &request(path)),
        ));
        let out = blocks(&through(bytes).await.expect("passes"));
        let authority = |fields: &Fields| {
            fields
                .iter()
                .find(|(n, _)| n == b":authority")
                .expect("authority")
                .1
                .clone()
        };
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].0, 0x4);
        assert_eq!(authority(&out[1].2), AUTHORITY);
        assert_eq!(out[1].2.len(), 5, "every other field kept: {:?}", out[1].2);
        assert_eq!((out[2].0, out[2].1), (0x0, END_STREAM));
        assert_eq!(authority(&out[3].2), AUTHORITY);
        assert_eq!(out[3].1, END_HEADERS | END_STREAM);
    }

    #[tokio::test]
    async fn a_valid_authority_is_kept_and_padding_priority_continuation_are_undone() {
        let mut encoder = loona_hpack::Encoder::new();
        let block = encode(&mut encoder, &request(b"localhost:1234"));
        let (a, b) = block.split_at(block.len() / 2);
        let mut payload = vec![3]; // pad length
        payload.extend([0x80, 0, 0, 0, 16]); // priority
        payload.extend(a);
        payload.extend([0, 0, 0]);
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(HEADERS, PADDED | PRIORITY, 1, &payload));
        bytes.extend(frame(CONTINUATION, END_HEADERS, 1, b));
        let out = blocks(&through(bytes).await.expect("passes"));
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].1,
            PRIORITY | END_HEADERS,
            "one HEADERS, its priority kept, no padding"
        );
        let fields = &out[0].2;
        assert!(fields.contains(&(b":authority".to_vec(), b"localhost:1234".to_vec())));
    }

    #[tokio::test]
    async fn a_frame_inside_a_header_block_is_refused() {
        let mut encoder = loona_hpack::Encoder::new();
        let mut bytes = PREFACE.to_vec();
        bytes.extend(frame(
            HEADERS,
            0,
            1,
            &encode(&mut encoder, &request(b"/x.sock")),
        ));
        bytes.extend(frame(0x0, 0, 1, &[]));
        let error = through(bytes).await.expect_err("refused");
        assert_eq!(error.kind(), io::ErrorKind::InvalidData);
        assert!(
            error.to_string().contains("inside a header block"),
            "{error}"
        );
    }
}

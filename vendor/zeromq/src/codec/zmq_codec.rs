use super::command::ZmqCommand;
use super::error::CodecError;
use super::greeting::ZmqGreeting;
use super::Message;
use crate::{SocketOptions, ZmqMessage};

use asynchronous_codec::{Decoder, Encoder};
use bytes::{Buf, Bytes, BytesMut};

use std::convert::TryFrom;

// sgl-router patch: bounds on what a peer's frame headers can make the decoder
// hold. Upstream 0.7 reserves whatever length a header declares before reading
// any of it, so 9 bytes declaring 2^40 abort the process; and it accumulates
// MORE frames without limit. Past any of these bounds `decode` returns
// `CodecError::Decode`, the connection is dropped and the socket reconnects as
// it does after any decode error. See vendor/zeromq/PATCHES.md.

/// Largest body, in bytes, of one message frame. A header declaring more is a
/// decode error instead of a reservation. 64 MiB is four times the largest
/// KV-event payload sgl-router decodes (16 MiB, `kv_events::wire`), so no
/// frame the router would accept is refused here.
pub const MAX_FRAME_BYTES: usize = 64 * 1024 * 1024;

/// Largest body, in bytes, of one command frame. The only command this crate
/// parses is READY: a command name, Socket-Type, an Identity of at most 255
/// bytes and a few metadata properties, well under 1 KiB in practice. The
/// bound also caps the properties map a READY can make the handshake build.
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;

/// Most frames in one multipart message. KV events carry 3 (topic, seq,
/// payload), replay replies 3 or 4; a peer sending MORE frames without end
/// would otherwise grow the buffered message without bound.
pub const MAX_MESSAGE_FRAMES: usize = 64;

/// Most body bytes across the frames of one multipart message, checked at each
/// frame header, before its body is read or reserved.
pub const MAX_MESSAGE_BYTES: usize = MAX_FRAME_BYTES;

#[derive(Debug, Clone, Copy)]
struct Frame {
    command: bool,
    long: bool,
    more: bool,
}

#[derive(Debug)]
enum DecoderState {
    Greeting,
    FrameHeader,
    FrameLen(Frame),
    Frame(Frame),
}

#[derive(Debug)]
pub struct ZmqCodec {
    state: DecoderState,
    waiting_for: usize, // Number of bytes needed to decode frame
    // Needed to store incoming multipart message
    // This allows to encapsulate its processing inside codec and not expose
    // internal details to higher levels
    buffered_message: Option<ZmqMessage>,
    max_read_chunk_size: usize,
}

impl ZmqCodec {
    pub fn new() -> Self {
        Self::with_options(&SocketOptions::default())
    }

    pub(crate) fn with_options(options: &SocketOptions) -> Self {
        Self {
            state: DecoderState::Greeting,
            waiting_for: 64, // len of the greeting frame
            buffered_message: None,
            max_read_chunk_size: options.read_buffer_max_size,
        }
    }

    /// Returns the minimum additional bytes needed before decode can progress.
    pub(crate) fn bytes_needed(&self, buffered_len: usize) -> usize {
        self.waiting_for.saturating_sub(buffered_len)
    }
}

impl Default for ZmqCodec {
    fn default() -> Self {
        Self::new()
    }
}

impl Decoder for ZmqCodec {
    type Error = CodecError;
    type Item = Message;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Self::Item>, Self::Error> {
        // A single read can contain thousands of frames; keep stack use independent of that count.
        loop {
            if src.len() < self.waiting_for {
                // The final read may coalesce bytes from the following frame. Reserve
                // its headroom now rather than grow shared storage again at the frame tail.
                // Qualifying retained frames must leave a full chunk for the next read.
                // For frames near one chunk, spare shared storage makes the next
                // almost-complete frame copy its body when reserve detaches it from
                // a retained predecessor. Limit headroom to frames spanning more
                // than two chunks, where it adds less than half the body size.
                let reserve_to = if self.waiting_for > 2 * self.max_read_chunk_size {
                    // Frame lengths are validated with this headroom before entering Frame.
                    self.waiting_for + self.max_read_chunk_size
                } else {
                    self.waiting_for
                };
                src.reserve(reserve_to - src.len());
                return Ok(None);
            }
            match self.state {
                DecoderState::Greeting => {
                    if src[0] != 0xff {
                        return Err(CodecError::Decode("Bad first byte of greeting"));
                    }
                    self.state = DecoderState::FrameHeader;
                    self.waiting_for = 1;
                    return Ok(Some(Message::Greeting(ZmqGreeting::try_from(
                        src.split_to(64).freeze(),
                    )?)));
                }
                DecoderState::FrameHeader => {
                    let flags = src.get_u8();

                    let frame = Frame {
                        command: (flags & 0b0000_0100) != 0,
                        long: (flags & 0b0000_0010) != 0,
                        more: (flags & 0b0000_0001) != 0,
                    };
                    self.state = DecoderState::FrameLen(frame);
                    self.waiting_for = if frame.long { 8 } else { 1 };
                }
                DecoderState::FrameLen(frame) => {
                    let frame_len = if frame.long {
                        let len = usize::try_from(src.get_u64()).map_err(|_error| {
                            CodecError::Decode("Frame length exceeds read buffer capacity")
                        })?;
                        // The reader may prepare a full read chunk at the frame tail.
                        // Reject unrepresentable lengths here, before reserve or resize.
                        len.checked_add(self.max_read_chunk_size)
                            .filter(|&capacity| isize::try_from(capacity).is_ok())
                            .ok_or(CodecError::Decode(
                                "Frame length exceeds read buffer capacity",
                            ))?;
                        len
                    } else {
                        usize::from(src.get_u8())
                    };
                    // sgl-router patch: refuse oversize frames and messages here, before
                    // `waiting_for` makes the top of this loop reserve the declared length.
                    check_frame_len(frame, frame_len, self.buffered_message.as_ref())?;
                    self.state = DecoderState::Frame(frame);
                    self.waiting_for = frame_len;
                }
                DecoderState::Frame(frame) => {
                    let data = src.split_to(self.waiting_for);
                    self.state = DecoderState::FrameHeader;
                    self.waiting_for = 1;
                    if frame.command {
                        return Ok(Some(Message::Command(ZmqCommand::try_from(data.freeze())?)));
                    }

                    // process incoming message frame
                    match &mut self.buffered_message {
                        Some(v) => v.push_back(data.freeze()),
                        None => self.buffered_message = Some(ZmqMessage::from(data.freeze())),
                    }

                    if !frame.more {
                        // Quoth the Raven “Nevermore.”
                        return Ok(Some(Message::Message(
                            self.buffered_message
                                .take()
                                .expect("Corrupted decoder state"),
                        )));
                    }
                }
            }
        }
    }
}

// sgl-router patch: the checks behind the bounds above, on a frame header about
// to be read with `buffered`, the frames of its message received so far.
fn check_frame_len(
    frame: Frame,
    len: usize,
    buffered: Option<&ZmqMessage>,
) -> Result<(), CodecError> {
    if frame.command {
        return if len > MAX_COMMAND_BYTES {
            Err(CodecError::Decode("Command frame exceeds size limit"))
        } else {
            Ok(())
        };
    }
    if len > MAX_FRAME_BYTES {
        return Err(CodecError::Decode("Frame length exceeds size limit"));
    }
    let (frames, bytes) = buffered.map_or((0, 0), |message| {
        (message.len(), message.iter().map(Bytes::len).sum::<usize>())
    });
    if frames >= MAX_MESSAGE_FRAMES {
        return Err(CodecError::Decode("Message exceeds frame count limit"));
    }
    if bytes + len > MAX_MESSAGE_BYTES {
        return Err(CodecError::Decode("Message exceeds size limit"));
    }
    Ok(())
}

fn encode_frame(frame: &Bytes, dst: &mut BytesMut, more: bool) {
    let mut flags: u8 = 0;
    if more {
        flags |= 0b0000_0001;
    }
    let len = frame.len();
    if len > 255 {
        flags |= 0b0000_0010;
        dst.reserve(len + 9);
        let mut header = [0u8; 9];
        header[0] = flags;
        header[1..].copy_from_slice(&(len as u64).to_be_bytes());
        dst.extend_from_slice(&header);
    } else {
        dst.reserve(len + 2);
        dst.extend_from_slice(&[flags, len as u8]);
    }
    dst.extend_from_slice(frame.as_ref());
}

impl Encoder for ZmqCodec {
    type Error = CodecError;
    type Item<'a> = Message;

    fn encode(&mut self, message: Self::Item<'_>, dst: &mut BytesMut) -> Result<(), Self::Error> {
        match message {
            Message::Greeting(payload) => dst.unsplit(payload.into()),
            Message::Command(command) => dst.unsplit(command.into()),
            Message::Message(message) => {
                let last_element = message.len() - 1;
                for (idx, part) in message.iter().enumerate() {
                    encode_frame(part, dst, idx != last_element);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    mod multipart;
    mod read_buffer;

    use super::*;

    #[test]
    pub fn test_message_decode_1() {
        let data = "01093c4944537c4d53473e01403239386166316563653932306635373637656132393438376261363164643436613534636334313262653032303339316139653831636535633234383039653001cb7b226d73675f6964223a2236356336396230312d636634622d343563322d616165612d323263306365326531316533222c2273657373696f6e223a2230326462356631642d386535632d346464612d383064342d303337363835343465616138222c22757365726e616d65223a223c544f444f3e222c2264617465223a22323032312d31322d32395430343a35393a33392e3539333533372b30303a3030222c226d73675f74797065223a22657865637574655f7265706c79222c2276657273696f6e223a22352e33227d01c07b226d73675f6964223a223965303336313036373262393433393961343432316539373330333330326162222c2273657373696f6e223a226231323139393364663235613432643839376135653163383362306337616665222c22757365726e616d65223a22757365726e616d65222c2264617465223a22313937302d30312d30315430303a30303a30302b30303a3030222c226d73675f74797065223a22657865637574655f72657175657374222c2276657273696f6e223a22352e32227d01027b7d00467b22737461747573223a226f6b222c22657865637574696f6e5f636f756e74223a312c227061796c6f6164223a5b5d2c22757365725f65787072657373696f6e73223a7b7d7d";
        let hex_data = hex::decode(data).unwrap();
        let mut bytes = BytesMut::from(hex_data.as_slice());
        let mut codec = ZmqCodec::new();
        codec.waiting_for = 1;
        codec.state = DecoderState::FrameHeader;

        let message = codec
            .decode(&mut bytes)
            .expect("decode success")
            .expect("single message");

        eprintln!("{:?}", message);
        match message {
            Message::Message(m) => {
                assert_eq!(6, m.into_vecdeque().len());
            }
            _ => panic!("wrong message type"),
        }
        assert_eq!(bytes.len(), 0);
    }

    #[test]
    pub fn test_message_decode_2() {
        let data = "01093c4944537c4d53473e01406139346435366530343438353335303831316561623063663730623464356366373933653431653838616330666339646263346562326238616136643635306601cb7b226d73675f6964223a2263383466623933372d333162662d346335622d386430392d386535633230633434333636222c2273657373696f6e223a2230326462356631642d386535632d346464612d383064342d303337363835343465616138222c22757365726e616d65223a223c544f444f3e222c2264617465223a22323032312d31322d32395430343a35393a34332e3037343831332b30303a3030222c226d73675f74797065223a22657865637574655f7265706c79222c2276657273696f6e223a22352e33227d01c07b226d73675f6964223a223238646635316334303933313433643339393131346664333439643530396634222c2273657373696f6e223a226231323139393364663235613432643839376135653163383362306337616665222c22757365726e616d65223a22757365726e616d65222c2264617465223a22313937302d30312d30315430303a30303a30302b30303a3030222c226d73675f74797065223a22657865637574655f72657175657374222c2276657273696f6e223a22352e32227d01027b7d00467b22737461747573223a226f6b222c22657865637574696f6e5f636f756e74223a322c227061796c6f6164223a5b5d2c22757365725f65787072657373696f6e73223a7b7d7d";
        let hex_data = hex::decode(data).unwrap();
        let mut bytes = BytesMut::from(hex_data.as_slice());
        let mut codec = ZmqCodec::new();
        codec.waiting_for = 1;
        codec.state = DecoderState::FrameHeader;

        let message = codec
            .decode(&mut bytes)
            .expect("decode success")
            .expect("single message");
        eprintln!("{:?}", message);
        assert_eq!(bytes.len(), 0);
        match message {
            Message::Message(m) => {
                assert_eq!(6, m.into_vecdeque().len());
            }
            _ => panic!("wrong message type"),
        }
    }
}

//! A WebSocket frame's header (RFC 6455 5.2), decoded once for the gateway route's two readers
//! of raw frames: the tracker of the gateway's side (`gateway_proxy.rs`, which must know
//! where frames end to write a close of its own) and the caller's first frame
//! (`gateway_connect.rs`).

/// What a frame's header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Header {
    pub fin: bool,
    pub opcode: u8,
    /// The masking key (clients mask every frame; servers none).
    pub mask: Option<[u8; 4]>,
    /// The header's own length on the wire: 2 to 14 bytes.
    pub header_len: usize,
    /// The payload's length.
    pub payload_len: u64,
}

/// The header at the start of `bytes`, once all of it is there (`None` before).
pub(super) fn header(bytes: &[u8]) -> Option<Header> {
    let (&b0, rest) = bytes.split_first()?;
    let (&b1, mut rest) = rest.split_first()?;
    let payload_len = match b1 & 0x7f {
        126 => {
            let (n, r) = rest.split_at_checked(2)?;
            rest = r;
            u64::from(u16::from_be_bytes([n[0], n[1]]))
        }
        127 => {
            let (n, r) = rest.split_at_checked(8)?;
            rest = r;
            u64::from_be_bytes(n.try_into().ok()?)
        }
        n => u64::from(n),
    };
    let mask = if b1 & 0x80 != 0 {
        let (m, r) = rest.split_at_checked(4)?;
        rest = r;
        Some([m[0], m[1], m[2], m[3]])
    } else {
        None
    };
    Some(Header {
        fin: b0 & 0x80 != 0,
        opcode: b0 & 0x0f,
        mask,
        header_len: bytes.len() - rest.len(),
        payload_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_three_lengths_and_the_mask_are_read_once_all_there() {
        assert_eq!(
            header(&[0x81, 0x05]),
            Some(Header {
                fin: true,
                opcode: 1,
                mask: None,
                header_len: 2,
                payload_len: 5
            })
        );
        let h = [0x02, 0x80 | 126, 0x01, 0x00, 9, 8, 7, 6];
        assert_eq!(
            header(&h),
            Some(Header {
                fin: false,
                opcode: 2,
                mask: Some([9, 8, 7, 6]),
                header_len: 8,
                payload_len: 256
            })
        );
        assert!(header(&h[..7]).is_none());
        let long = [0x88, 127, 0, 0, 0, 0, 0, 1, 0, 0];
        assert_eq!(
            header(&long).map(|h| (h.header_len, h.payload_len)),
            Some((10, 65_536))
        );
        assert!(header(&long[..9]).is_none());
        assert!(header(&[0x81]).is_none());
    }
}

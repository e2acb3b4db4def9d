//! A WebSocket client's frame (RFC 6455 5.2), encoded once for the three clients of a
//! gateway's WebSocket: hostd's and the Kubernetes backend's RPC to the gateway
//! (`gateway_rpc`), and the coordinator's rewrite of a caller's `connect` request. The frame
//! may carry the gateway's password, so it is built in a buffer zeroed when dropped.

use zeroize::Zeroizing;

/// A final (FIN) frame of `opcode` carrying `payload`, masked with `mask` as a client must.
pub fn client_frame(opcode: u8, payload: &[u8], mask: [u8; 4]) -> Zeroizing<Vec<u8>> {
    let mut f = Zeroizing::new(Vec::with_capacity(payload.len() + 14));
    f.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => f.push(0x80 | n as u8),
        n if n <= usize::from(u16::MAX) => {
            f.push(0x80 | 126);
            f.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            f.push(0x80 | 127);
            f.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    f.extend_from_slice(&mask);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unmasked(frame: &[u8], header: usize) -> Vec<u8> {
        let mask = &frame[header - 4..header];
        frame[header..]
            .iter()
            .enumerate()
            .map(|(i, b)| b ^ mask[i % 4])
            .collect()
    }

    #[test]
    fn each_length_form_is_masked_and_final() {
        let mask = [1, 2, 3, 4];
        for (len, header, second) in [(5usize, 6usize, 0x85u8), (300, 8, 0xfe), (70_000, 14, 0xff)]
        {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let f = client_frame(0x1, &payload, mask);
            assert_eq!(f[0], 0x81, "{len}");
            assert_eq!(f[1], second, "{len}");
            assert_eq!(f.len(), header + len, "{len}");
            assert_eq!(unmasked(&f, header), payload, "{len}");
            if len > 5 {
                assert_ne!(&f[header..], &payload[..], "{len}: not masked");
            }
        }
        assert_eq!(
            &client_frame(0x1, &[0; 300], mask)[2..4],
            &300u16.to_be_bytes()
        );
        assert_eq!(
            &client_frame(0x1, &[0; 70_000], mask)[2..10],
            &70_000u64.to_be_bytes()
        );
        assert_eq!(client_frame(0xA, b"", mask)[..], [0x8a, 0x80, 1, 2, 3, 4]);
    }
}

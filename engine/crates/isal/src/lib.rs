//! CRC32C and Reed-Solomon erasure coding from ISA-L.

use std::os::raw::{c_int, c_uchar, c_uint};

extern "C" {
    fn crc32_iscsi(buffer: *const c_uchar, len: c_int, init_crc: c_uint) -> c_uint;
    fn gf_gen_cauchy1_matrix(a: *mut c_uchar, m: c_int, k: c_int);
    fn gf_invert_matrix(input: *mut c_uchar, output: *mut c_uchar, n: c_int) -> c_int;
    fn ec_init_tables(k: c_int, rows: c_int, a: *const c_uchar, gftbls: *mut c_uchar);
    fn ec_encode_data(
        len: c_int,
        k: c_int,
        rows: c_int,
        gftbls: *const c_uchar,
        data: *const *const c_uchar,
        coding: *const *mut c_uchar,
    );
}

/// Standard CRC32C (Castagnoli, as iSCSI): `crc32c(b"123456789") == 0xE306_9283`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c_append(0, data)
}

/// Continue a CRC32C over more bytes: `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`.
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    let mut state = !crc;
    // ISA-L takes an int length: feed huge buffers in pieces.
    for piece in data.chunks(1 << 30) {
        // SAFETY: `piece` is a live slice of at most 2^30 bytes (fits an int), read only.
        state = unsafe { crc32_iscsi(piece.as_ptr(), piece.len() as c_int, state) };
    }
    !state
}

/// CRC32C's polynomial, bit-reflected.
const POLY: u32 = 0x82F6_3B78;

/// `a * b` modulo the CRC polynomial (bit-reflected: bit 31 is x^0).
fn mult_mod_p(a: u32, mut b: u32) -> u32 {
    let mut m = 1u32 << 31;
    let mut p = 0;
    loop {
        if a & m != 0 {
            p ^= b;
            if a & (m - 1) == 0 {
                return p;
            }
        }
        m >>= 1;
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
    }
}

/// What appending `len` bytes does to a CRC32C, so that the CRC of a
/// concatenation follows from the CRCs of its parts (zlib's
/// `crc32_combine_gen`/`crc32_combine_op`, for CRC32C): summing chunks one
/// by one and combining their CRCs into the whole's costs one pass over the
/// bytes, not two.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crc32cShift(u32);

impl Crc32cShift {
    pub fn new(len: usize) -> Self {
        // x^(8 * len) modulo the polynomial, by squaring: x^1, x^2, x^4, ...
        let mut power = 1u32 << 30;
        let mut op = 1u32 << 31;
        let mut bits = (len as u64) * 8;
        while bits != 0 {
            if bits & 1 != 0 {
                op = mult_mod_p(power, op);
            }
            power = mult_mod_p(power, power);
            bits >>= 1;
        }
        Crc32cShift(op)
    }

    /// `crc32c(a ++ b)` from `crc32c(a)` and `crc32c(b)`, `b` of the length this shift was made for.
    pub fn combine(self, crc_a: u32, crc_b: u32) -> u32 {
        mult_mod_p(self.0, crc_a) ^ crc_b
    }
}

/// A Reed-Solomon code with `k` data cells and `p` parity cells (Cauchy matrix).
#[derive(Clone)]
pub struct ReedSolomon {
    k: usize,
    p: usize,
    /// (k + p) x k encode matrix; the top k rows are the identity.
    matrix: Vec<u8>,
    parity_tables: Vec<u8>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum EcError {
    /// Fewer than k cells survive.
    TooManyLost { k: usize, present: usize },
    /// Cells of unequal length or a wrong count were given.
    BadShape(String),
}

impl std::fmt::Display for EcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EcError::TooManyLost { k, present } => {
                write!(
                    f,
                    "erasure code: need {k} cells to rebuild, only {present} present"
                )
            }
            EcError::BadShape(s) => write!(f, "erasure code: {s}"),
        }
    }
}
impl std::error::Error for EcError {}

impl ReedSolomon {
    pub fn new(k: usize, p: usize) -> Self {
        assert!(k >= 1 && p >= 1 && k + p <= 255, "invalid RS({k},{p})");
        let mut matrix = vec![0u8; (k + p) * k];
        // SAFETY: `matrix` holds the (k + p) x k bytes ISA-L writes; k + p <= 255.
        unsafe { gf_gen_cauchy1_matrix(matrix.as_mut_ptr(), (k + p) as c_int, k as c_int) };
        let mut parity_tables = vec![0u8; k * p * 32];
        // SAFETY: the parity rows are p x k bytes of `matrix`, and the tables
        // k * p * 32 bytes, as ec_init_tables reads and writes.
        unsafe {
            ec_init_tables(
                k as c_int,
                p as c_int,
                matrix[k * k..].as_ptr(),
                parity_tables.as_mut_ptr(),
            )
        };
        ReedSolomon {
            k,
            p,
            matrix,
            parity_tables,
        }
    }

    pub fn data_cells(&self) -> usize {
        self.k
    }
    pub fn parity_cells(&self) -> usize {
        self.p
    }

    /// Compute the parity cells of `data` (k cells of equal length).
    pub fn encode(&self, data: &[&[u8]]) -> Result<Vec<Vec<u8>>, EcError> {
        if data.len() != self.k {
            return Err(EcError::BadShape(format!(
                "expected {} data cells, got {}",
                self.k,
                data.len()
            )));
        }
        let len = data[0].len();
        if data.iter().any(|d| d.len() != len) {
            return Err(EcError::BadShape("data cells differ in length".into()));
        }
        let mut parity = vec![vec![0u8; len]; self.p];
        if len == 0 {
            return Ok(parity);
        }
        let src: Vec<*const u8> = data.iter().map(|d| d.as_ptr()).collect();
        let dst: Vec<*mut u8> = parity.iter_mut().map(|p| p.as_mut_ptr()).collect();
        // SAFETY: k source and p destination pointers, each to `len` live
        // bytes (checked above); the tables are the k x p ones built in new().
        unsafe {
            ec_encode_data(
                len as c_int,
                self.k as c_int,
                self.p as c_int,
                self.parity_tables.as_ptr(),
                src.as_ptr(),
                dst.as_ptr(),
            )
        };
        Ok(parity)
    }

    /// Rebuild missing cells in place. `cells` has k + p entries (data then
    /// parity); `None` marks a lost cell. On success every entry is `Some`.
    pub fn reconstruct(&self, cells: &mut [Option<Vec<u8>>]) -> Result<(), EcError> {
        let n = self.k + self.p;
        if cells.len() != n {
            return Err(EcError::BadShape(format!(
                "expected {n} cells, got {}",
                cells.len()
            )));
        }
        let present: Vec<usize> = (0..n).filter(|&i| cells[i].is_some()).collect();
        if present.len() < self.k {
            return Err(EcError::TooManyLost {
                k: self.k,
                present: present.len(),
            });
        }
        let missing: Vec<usize> = (0..n).filter(|&i| cells[i].is_none()).collect();
        if missing.is_empty() {
            return Ok(());
        }
        let len = cells[present[0]].as_ref().unwrap().len();
        if present
            .iter()
            .any(|&i| cells[i].as_ref().unwrap().len() != len)
        {
            return Err(EcError::BadShape("cells differ in length".into()));
        }
        let k = self.k;
        let survivors = &present[..k];
        // Invert the rows of the survivors to express every data cell in them.
        let mut sub = vec![0u8; k * k];
        for (r, &row) in survivors.iter().enumerate() {
            sub[r * k..(r + 1) * k].copy_from_slice(&self.matrix[row * k..(row + 1) * k]);
        }
        let mut inv = vec![0u8; k * k];
        // SAFETY: `sub` and `inv` are k x k bytes each.
        if unsafe { gf_invert_matrix(sub.as_mut_ptr(), inv.as_mut_ptr(), k as c_int) } != 0 {
            return Err(EcError::BadShape("singular decode matrix".into()));
        }
        // Row i of the decode matrix: missing cell i as a combination of survivors.
        let mut decode = vec![0u8; missing.len() * k];
        for (r, &m) in missing.iter().enumerate() {
            let row = &mut decode[r * k..(r + 1) * k];
            if m < k {
                row.copy_from_slice(&inv[m * k..(m + 1) * k]);
            } else {
                for (j, out) in row.iter_mut().enumerate() {
                    let mut acc = 0u8;
                    for i in 0..k {
                        acc ^= gf_mul(self.matrix[m * k + i], inv[i * k + j]);
                    }
                    *out = acc;
                }
            }
        }
        let mut tables = vec![0u8; k * missing.len() * 32];
        // SAFETY: `decode` is missing.len() x k bytes and `tables` 32 times that.
        unsafe {
            ec_init_tables(
                k as c_int,
                missing.len() as c_int,
                decode.as_ptr(),
                tables.as_mut_ptr(),
            )
        };
        let mut out = vec![vec![0u8; len]; missing.len()];
        if len > 0 {
            let src: Vec<*const u8> = survivors
                .iter()
                .map(|&i| cells[i].as_ref().unwrap().as_ptr())
                .collect();
            let dst: Vec<*mut u8> = out.iter_mut().map(|o| o.as_mut_ptr()).collect();
            // SAFETY: k survivor and missing.len() output pointers, each to
            // `len` live bytes; the tables match (k, missing.len()).
            unsafe {
                ec_encode_data(
                    len as c_int,
                    k as c_int,
                    missing.len() as c_int,
                    tables.as_ptr(),
                    src.as_ptr(),
                    dst.as_ptr(),
                )
            };
        }
        for (m, cell) in missing.into_iter().zip(out) {
            cells[m] = Some(cell);
        }
        Ok(())
    }
}

/// GF(2^8) multiply with ISA-L's polynomial (0x11d).
fn gf_mul(a: u8, b: u8) -> u8 {
    let (mut a, mut b, mut p) = (a as u16, b, 0u16);
    while b != 0 {
        if b & 1 != 0 {
            p ^= a;
        }
        a <<= 1;
        if a & 0x100 != 0 {
            a ^= 0x11d;
        }
        b >>= 1;
    }
    p as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xE306_9283);
    }

    #[test]
    fn crc32c_of_a_concatenation_follows_from_its_parts() {
        let data: Vec<u8> = (0..20_000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for cut in [0, 1, 7, 4096, 12_345, 20_000] {
            let (a, b) = data.split_at(cut);
            let shift = Crc32cShift::new(b.len());
            assert_eq!(
                shift.combine(crc32c(a), crc32c(b)),
                crc32c(&data),
                "cut at {cut}"
            );
        }
        let mut crc = 0;
        let four_k = Crc32cShift::new(4096);
        for c in data[..16_384].chunks(4096) {
            crc = four_k.combine(crc, crc32c(c));
        }
        assert_eq!(crc, crc32c(&data[..16_384]));
    }

    #[test]
    fn rs_rebuilds_any_lost_cells() {
        for (k, p) in [(2, 1), (4, 2)] {
            let rs = ReedSolomon::new(k, p);
            let data: Vec<Vec<u8>> = (0..k)
                .map(|i| (0..4096).map(|j| (i * 131 + j * 7) as u8).collect())
                .collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
            let parity = rs.encode(&refs).unwrap();
            let all: Vec<Vec<u8>> = data.iter().cloned().chain(parity).collect();
            // Lose every combination of up to p cells.
            for mask in 0u32..(1 << (k + p)) {
                if mask.count_ones() as usize > p {
                    continue;
                }
                let mut cells: Vec<Option<Vec<u8>>> = all
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        if mask & (1 << i) != 0 {
                            None
                        } else {
                            Some(c.clone())
                        }
                    })
                    .collect();
                rs.reconstruct(&mut cells).unwrap();
                for (i, c) in cells.iter().enumerate() {
                    assert_eq!(
                        c.as_ref().unwrap(),
                        &all[i],
                        "k={k} p={p} mask={mask:b} cell {i}"
                    );
                }
            }
            let mut too_few: Vec<Option<Vec<u8>>> = vec![None; k + p];
            too_few[0] = Some(all[0].clone());
            if k > 1 {
                assert!(matches!(
                    rs.reconstruct(&mut too_few),
                    Err(EcError::TooManyLost { .. })
                ));
            }
        }
    }
}

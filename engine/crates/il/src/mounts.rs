//! Which devices are Peregrine mounts (`fuse.peregrine` in
//! /proc/self/mountinfo).

use crate::real::{r_close, r_open, r_read};
use libc::c_void;
use parking_lot::Mutex;

pub(crate) struct Mounts {
    /// st_dev (major, minor) of `fuse.peregrine` mounts.
    peregrine: Vec<(u32, u32)>,
    /// Anonymous devices known not to be Peregrine mounts.
    other: Vec<(u32, u32)>,
    loaded: bool,
}

pub(crate) static MOUNTS: Mutex<Mounts> = Mutex::new(Mounts {
    peregrine: Vec::new(),
    other: Vec::new(),
    loaded: false,
});

/// /proc/self/mountinfo through the real open/read/close.
fn read_mountinfo() -> Vec<u8> {
    let mut out = Vec::new();
    // SAFETY: real calls on our own fd and buffer.
    unsafe {
        let fd = r_open()(
            c"/proc/self/mountinfo".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return out;
        }
        let mut buf = [0u8; 16384];
        loop {
            let n = r_read()(fd, buf.as_mut_ptr() as *mut c_void, buf.len());
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
        r_close()(fd);
    }
    out
}

/// Devices of the `fuse.peregrine` mounts in a mountinfo text.
fn peregrine_devs(text: &[u8]) -> Vec<(u32, u32)> {
    let mut v = Vec::new();
    for line in text.split(|&c| c == b'\n') {
        let f: Vec<&[u8]> = line.split(|&c| c == b' ').collect();
        let Some(sep) = f.iter().position(|x| *x == b"-") else {
            continue;
        };
        if f.get(sep + 1) != Some(&&b"fuse.peregrine"[..]) || f.len() < 3 {
            continue;
        }
        let dev = std::str::from_utf8(f[2]).ok().and_then(|d| {
            let (a, b) = d.split_once(':')?;
            Some((a.parse().ok()?, b.parse().ok()?))
        });
        if let Some(d) = dev {
            v.push(d);
        }
    }
    v
}

/// Is `dev` a Peregrine mount? Reread mountinfo on a miss (once per
/// unknown anonymous device).
pub(crate) fn is_peregrine_dev(dev: (u32, u32)) -> bool {
    if dev.0 != 0 {
        // FUSE mounts use anonymous (major 0) devices.
        return false;
    }
    let mut m = MOUNTS.lock();
    if m.peregrine.contains(&dev) {
        return true;
    }
    if m.loaded && m.other.contains(&dev) {
        return false;
    }
    m.peregrine = peregrine_devs(&read_mountinfo());
    m.loaded = true;
    if m.peregrine.contains(&dev) {
        m.other.retain(|d| *d != dev);
        return true;
    }
    if m.other.len() < 4096 {
        m.other.push(dev);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_devices() {
        let t = b"22 1 0:21 / /proc rw - proc proc rw\n\
                  99 30 0:77 / /mnt/a\\040b rw,nosuid - fuse.peregrine peregrine rw,user_id=0\n\
                  100 30 0:78 / /mnt/c rw - fuse.sshfs x rw\n";
        assert_eq!(peregrine_devs(t), vec![(0, 77)]);
    }
}

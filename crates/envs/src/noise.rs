//! Background telemetry: random, strictly irrelevant lines appended to observations
//! (docs/paper.md, "Noise (T = 50)"). They never mention items, shelves, branches or pull requests, and
//! they come from their own generator so the event sequence is the same at every noise level.

use crate::rng::SeededRng;

pub const HEADER: &str = "--- BACKGROUND TELEMETRY ---";

const CAMERA_NOTES: [&str; 8] = [
    "Forklift parked.",
    "Worker entered Zone A.",
    "Worker left Zone C.",
    "Pallet wrapped at the packing station.",
    "Dock door 3 opened.",
    "Dock door 3 closed.",
    "Cleaning robot passed aisle 7.",
    "Visitor badge scanned at the gate.",
];

/// `count` telemetry lines for warehouse observation number `index` of the run seeded `seed`.
pub fn warehouse_lines(seed: u64, index: usize, count: u32) -> Vec<String> {
    let mut rng = SeededRng::new(seed ^ 0x7E1E_7E1E ^ (index as u64).wrapping_mul(0x9E37_79B9));
    (0..count)
        .map(|_| match rng.below(3) {
            0 => format!(
                "[Robot R-{:02}] battery {}%, temperature {}.{}C, CPU load {}%, speed {}.{} m/s, nav confidence 0.{:02}",
                rng.below(40),
                20 + rng.below(80),
                30 + rng.below(20),
                rng.below(10),
                rng.below(100),
                rng.below(3),
                rng.below(10),
                80 + rng.below(20)
            ),
            1 => format!(
                "[Sensor Zone {}] humidity {}%, temperature {}.{}C, light {} lux, CO2 {} ppm",
                ["A", "B", "C", "D"][rng.index(4)],
                30 + rng.below(40),
                15 + rng.below(10),
                rng.below(10),
                200 + rng.below(600),
                400 + rng.below(500)
            ),
            _ => format!("[Camera {:02} OCR] {}", rng.below(24), rng.pick(&CAMERA_NOTES)),
        })
        .collect()
}

/// `count` syslog lines for repository observation number `index`.
pub fn syslog_lines(seed: u64, index: usize, count: u32) -> Vec<String> {
    let mut rng = SeededRng::new(seed ^ 0x5150_5150 ^ (index as u64).wrapping_mul(0x9E37_79B9));
    (0..count)
        .map(|_| match rng.below(3) {
            0 => format!(
                "[Syslog] Server-{} CPU load: {}%, RAM usage: {}%",
                rng.below(64),
                rng.below(100),
                20 + rng.below(80)
            ),
            1 => format!(
                "[Syslog] Disk /var on node-{} at {}% capacity",
                rng.below(16),
                30 + rng.below(70)
            ),
            _ => format!(
                "[Syslog] cron job backup-{} finished in {}s",
                rng.below(9),
                1 + rng.below(300)
            ),
        })
        .collect()
}

/// Appends telemetry under its header, or returns the text unchanged when there is none.
pub fn with_telemetry(text: String, lines: Vec<String>) -> String {
    if lines.is_empty() {
        return text;
    }
    format!("{text}\n{HEADER}\n{}", lines.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn telemetry_is_deterministic_and_never_names_task_objects() {
        assert_eq!(warehouse_lines(3, 5, 20), warehouse_lines(3, 5, 20));
        assert_ne!(warehouse_lines(3, 5, 20), warehouse_lines(3, 6, 20));
        for line in warehouse_lines(9, 1, 200)
            .iter()
            .chain(&syslog_lines(9, 1, 200))
        {
            for word in ["item_", "shelf_", "PR #", "feature/"] {
                assert!(!line.contains(word), "{line}");
            }
        }
        assert_eq!(with_telemetry("x".into(), vec![]), "x");
        assert_eq!(
            with_telemetry("x".into(), vec!["a".into()]),
            format!("x\n{HEADER}\na")
        );
    }
}

//! Idle pacing (`timing.idle-pace-us`, see the crate documentation): a ready wave waits for
//! its pace timer unless busy news (a BUSY token, a message passing through) says something
//! needs logical time; busy news travels on over the trunks, never back where it came from.

use super::{LinkId, TokenManager};

impl TokenManager {
    /// Something from `link` needs logical time to advance (a BUSY token, a message it sent
    /// through this TM): the next wave, and every one up to `until_wave`, goes out unpaced —
    /// the next one now, if it is ready.
    pub(super) fn busy_news(&mut self, now_us: u64, link: LinkId, until_wave: u64) {
        self.note_busy(link, until_wave.max(self.waves + 1));
        // Only a wave held by its pace timer can be released: any other ready wave already
        // went out (this runs for every forwarded message, so no scan of the links here).
        if self.pace_deadline_us.is_some() {
            self.try_send_waves(now_us);
        }
    }

    /// Waves up to `wave` go out unpaced, and carry BUSY to the other neighbours.
    pub(super) fn note_busy(&mut self, link: LinkId, wave: u64) {
        let l = &mut self.links[link];
        l.busy_until_wave = l.busy_until_wave.max(wave);
    }

    /// Does wave `wave`, ready to go, wait for the pace timer? Only with pacing on, never wave
    /// 1 (a restart is news), and only when no neighbour sent busy news that reaches it.
    pub(super) fn paces(&self, wave: u64) -> bool {
        self.cfg.timing.idle_pace_us > 0
            && wave > 1
            && self.links.iter().all(|l| l.busy_until_wave < wave)
    }

    /// The BUSY flag of token `wave` on `link`: busy news from another neighbour reaches it.
    /// Between TMs over the trunks (a tree) and never back where it came from
    /// (split horizon), so on a tree it travels away from its source and dies out; towards
    /// SIUs it is information only.
    pub(super) fn busy_towards(&self, link: LinkId, wave: u64) -> bool {
        self.links
            .iter()
            .enumerate()
            .any(|(i, l)| i != link && l.busy_until_wave >= wave)
    }
}

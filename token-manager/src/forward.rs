//! Forwarding: an isotach message rides with the next wave towards its destination (just
//! ahead of that wave's token, sharing its datagram), or waits for a neighbour that has not
//! started this generation; non-isotach traffic leaves at once. At a restart what belongs to
//! the generation that ends is dropped.

use super::{LinkId, TmError, TokenManager};
use isotach_proto::Input;
use isotach_proto::packet::IsotachMessage;

impl TokenManager {
    /// Forwards a message: it leaves before any later token on its output link. An isotach
    /// message rides with the next wave, or, for a neighbour that has not started this
    /// generation, waits for its first token; non-isotach traffic never waits on logical time
    /// and leaves at once.
    pub(super) fn forward(
        &mut self,
        dest: u16,
        inp: Input<'_>,
        isotach: bool,
    ) -> Result<(), TmError> {
        let Some(&link) = self.route.get(usize::from(dest)) else {
            return Err(TmError::NoSuchHost(dest));
        };
        self.stats.messages_forwarded += 1;
        let bytes = inp.into_vec();
        let l = &mut self.links[link];
        if isotach && (!self.started || l.accepted == 0) {
            l.held.push_back(bytes);
            self.held += 1;
            self.stats.messages_held += 1;
            debug_assert_eq!(self.held, self.held_in_links());
            return Ok(());
        }
        if isotach {
            l.riding.push(bytes);
            self.riding += 1;
        } else {
            self.out.push_back((link, bytes));
        }
        Ok(())
    }

    /// At a restart, messages riding with the next wave of the generation that ends are
    /// dropped: no token of that generation follows them, so their pulses could never end
    /// (a destination discards them at the reset), and a neighbour that restarted would get
    /// a generation it never saw.
    pub(super) fn drop_riding(&mut self) {
        for l in &mut self.links {
            self.stats.messages_stale += l.riding.len() as u64;
            l.riding.clear();
        }
        self.riding = 0;
    }

    /// The messages riding towards `link` go out now (ahead of a token about to follow them).
    pub(super) fn release_riding(&mut self, link: LinkId) {
        let riding = &mut self.links[link].riding;
        self.riding -= riding.len();
        self.out.extend(riding.drain(..).map(|b| (link, b)));
    }

    /// The message was sent in this TM's generation. One of another was sent before a
    /// restart (or, from a faulty peer, after one this TM has not taken): forwarded, it would
    /// land in a pulse of another generation. A neighbour gets this generation's messages
    /// only after its first token of it, so a correct one never sends a newer generation's.
    pub(super) fn in_this_generation(&self, bytes: &[u8]) -> bool {
        IsotachMessage::peek_generation(bytes) == Some(self.generation)
    }

    /// At a restart, held messages of the generation that ends are dropped; on a first start
    /// those of the generation it starts (from neighbours that started it first) stay held.
    pub(super) fn drop_held_of_other_generations(&mut self) {
        let generation = self.generation;
        for l in &mut self.links {
            let before = l.held.len();
            l.held
                .retain(|b| IsotachMessage::peek_generation(b) == Some(generation));
            let dropped = before - l.held.len();
            self.held -= dropped;
            self.stats.messages_stale += dropped as u64;
        }
        debug_assert_eq!(self.held, self.held_in_links());
    }

    /// The neighbour on `link` proved it started: its held messages go out, in order.
    pub(super) fn release_held(&mut self, link: LinkId) {
        debug_assert_eq!(self.held, self.held_in_links());
        let held = std::mem::take(&mut self.links[link].held);
        self.held -= held.len();
        self.out.extend(held.into_iter().map(|b| (link, b)));
        debug_assert_eq!(self.held, self.held_in_links());
    }

    /// Messages held in all links, counted (`self.held` keeps the sum).
    pub(super) fn held_in_links(&self) -> usize {
        self.links.iter().map(|l| l.held.len()).sum()
    }
}

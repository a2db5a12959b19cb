//! The SMTP sink of the outbox: emails leave through a relay given by `--smtp-url`
//! (`smtps://user:pass@host`, `smtp://…?tls=required`, or plain `smtp://host:port` for a local
//! relay). Each message's `Message-ID` is its outbox idempotency key, so a relay or mailbox that
//! sees a repeat (delivery is at least once) can drop it. Pages have no SMTP route: without a
//! paging gateway they are logged as the log sink does.

use lettre::message::Mailbox;
use lettre::message::header::ContentType;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use shared::services::outbox::OutboxRow;
use shared::services::outbox::{LogSink, Sink};

pub struct SmtpSink {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
}

impl SmtpSink {
    pub fn new(url: &str, from: &str) -> anyhow::Result<Self> {
        let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)?.build();
        Ok(SmtpSink { transport, from: from.parse()? })
    }
}

impl Sink for SmtpSink {
    async fn deliver(&self, m: &OutboxRow) -> Result<(), String> {
        if m.channel != "email" {
            return LogSink.deliver(m).await;
        }
        let to: Mailbox = m.recipient.parse().map_err(|e| format!("recipient: {e}"))?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(m.subject.clone())
            .message_id(Some(format!("<{}@gatehouse>", m.idempotency_key.replace(':', "."))))
            .header(ContentType::TEXT_PLAIN)
            .body(m.body.clone())
            .map_err(|e| format!("message: {e}"))?;
        self.transport.send(message).await.map(|_| ()).map_err(|e| format!("smtp: {e}"))?;
        tracing::info!(outbox.id = m.id, outbox.key = %m.idempotency_key, "email delivered (smtp)");
        Ok(())
    }
}

-- The bookings product: customers, technicians, the service catalog, bookings and notes.
-- Every row carries tenant_id; every lookup by handle filters by it.
CREATE TABLE customers (
    id                    BIGSERIAL PRIMARY KEY,
    tenant_id             BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle                TEXT NOT NULL UNIQUE CHECK (handle LIKE 'cus\_%'),
    name                  TEXT NOT NULL,
    email                 TEXT,
    phone                 TEXT,
    -- The customer's self-service portal credential: never leaves the server.
    portal_password_hash  TEXT,
    created_by            BIGINT REFERENCES people(id),
    created_at            TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at            TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX customers_tenant_name_idx ON customers (tenant_id, lower(name), handle);
CREATE INDEX customers_tenant_email_idx ON customers (tenant_id, lower(email));

CREATE TABLE technicians (
    id            BIGSERIAL PRIMARY KEY,
    tenant_id     BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle        TEXT NOT NULL UNIQUE CHECK (handle LIKE 'tec\_%'),
    name          TEXT NOT NULL,
    email         TEXT,
    phone         TEXT,
    skills        TEXT[] NOT NULL DEFAULT '{}',
    active        BOOLEAN NOT NULL DEFAULT true,
    -- Private to the tenant's staff tools; no presenter lists it.
    home_address  TEXT,
    created_at    TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at    TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX technicians_tenant_name_idx ON technicians (tenant_id, lower(name), handle);

CREATE TABLE services (
    id                BIGSERIAL PRIMARY KEY,
    tenant_id         BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle            TEXT NOT NULL UNIQUE CHECK (handle LIKE 'svc\_%'),
    name              TEXT NOT NULL,
    duration_minutes  INTEGER NOT NULL CHECK (duration_minutes > 0),
    price_minor       BIGINT NOT NULL CHECK (price_minor >= 0),
    -- Tax rate in basis points (1900 = 19.00 %).
    tax_rate_bp       INTEGER NOT NULL CHECK (tax_rate_bp BETWEEN 0 AND 10000),
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE bookings (
    id             BIGSERIAL PRIMARY KEY,
    tenant_id      BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle         TEXT NOT NULL UNIQUE CHECK (handle LIKE 'bkg\_%'),
    customer_id    BIGINT NOT NULL REFERENCES customers(id),
    technician_id  BIGINT REFERENCES technicians(id),
    service_id     BIGINT NOT NULL REFERENCES services(id),
    starts_at      TIMESTAMPTZ NOT NULL,
    -- The IANA zone the booking was made in; times are shown in it.
    zone           TEXT NOT NULL,
    status         TEXT NOT NULL CHECK (status IN ('draft', 'confirmed', 'cancelled', 'completed')),
    currency       CHAR(3) NOT NULL,
    net_minor      BIGINT NOT NULL,
    tax_minor      BIGINT NOT NULL,
    total_minor    BIGINT NOT NULL CHECK (total_minor = net_minor + tax_minor),
    -- Written by the customer: third-party text (R13).
    customer_note  TEXT,
    created_by     BIGINT REFERENCES people(id),
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX bookings_tenant_start_idx ON bookings (tenant_id, starts_at, handle);
CREATE INDEX bookings_tenant_customer_idx ON bookings (tenant_id, customer_id);
CREATE INDEX bookings_tenant_technician_idx ON bookings (tenant_id, technician_id);

CREATE TABLE booking_notes (
    id          BIGSERIAL PRIMARY KEY,
    tenant_id   BIGINT NOT NULL REFERENCES tenants(id) ON DELETE CASCADE,
    handle      TEXT NOT NULL UNIQUE CHECK (handle LIKE 'bnt\_%'),
    booking_id  BIGINT NOT NULL REFERENCES bookings(id) ON DELETE CASCADE,
    -- Who wrote it: staff, customer or an external system. Only staff text is trusted.
    source      TEXT NOT NULL CHECK (source IN ('staff', 'customer', 'external')),
    author_id   BIGINT REFERENCES people(id),
    body        TEXT NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX booking_notes_booking_idx ON booking_notes (tenant_id, booking_id, created_at);

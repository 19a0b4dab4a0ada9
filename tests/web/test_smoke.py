"""A first check that the in-process client and both stores work."""


async def test_register_then_login(client):
    response = await client.post("/api/v1/auth/register", json={"user_name": "alice", "password": "password-1"})
    assert response.status_code == 201
    user_id = response.json()["user_id"]
    response = await client.post("/api/v1/auth/login", json={"user_name": "alice", "password": "password-1"})
    assert response.status_code == 200
    body = response.json()
    assert body["token"] == body["access_token"]
    from orchestra.db.models import User
    stored = await User.aget(User.id == user_id)
    assert stored.password_hash.startswith("$argon2id$")

def test_it_creates_a_session_and_appends_events(alice_api):
    response = alice_api.post(
        "/api/v1/sessions", {"model": "gpt-4o", "systemPrompt": "You are helpful."}, format="json"
    )
    assert response.status_code == 201, response.json()
    session = response.json()
    assert session["contextLimit"] == 128000
    response = alice_api.post(
        f"/api/v1/sessions/{session['id']}/events",
        [
            {"type": "USER_MESSAGE", "content": "hello world"},
            {
                "type": "AGENT_MESSAGE",
                "content": "hi",
                "tokenUsage": {"promptTokens": 10, "completionTokens": 2, "totalTokens": 12},
            },
        ],
        format="json",
    )
    assert response.status_code == 201, response.json()
    assert [e["seq"] for e in response.json()] == [2, 3]
    usage = alice_api.get(f"/api/v1/sessions/{session['id']}/usage").json()
    assert usage["totalTokens"] == 12
    assert usage["reportedEventCount"] == 1
    context = alice_api.get(f"/api/v1/sessions/{session['id']}/context").json()
    assert context["tokenCount"] == usage["contextTokens"]
    assert [m["role"] for m in context["messages"]] == ["system", "user", "assistant"]

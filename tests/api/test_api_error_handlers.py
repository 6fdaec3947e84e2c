from django.test import RequestFactory

from sessions_app.api.errors import server_error


def test_it_answers_an_unknown_api_path_in_the_error_format(alice_api):
    response = alice_api.get("/api/v1/no-such-thing")
    assert response.status_code == 404
    assert response.json()["error"] == "not_found"


def test_it_answers_an_api_server_error_in_the_error_format():
    response = server_error(RequestFactory().get("/api/v1/sessions"))
    assert response.status_code == 500
    assert b'"error": "internal_error"' in response.content


def test_it_keeps_html_error_pages_outside_the_api(client, alice):
    client.force_login(alice)
    response = client.get("/no-such-page/")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
